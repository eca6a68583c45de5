"""One writer at a time for a prepared corpus (minilmd/corpus/prepare/lock.py; issue 21): `prepare` into an --out,
`prepare --force` and `prepare --append` exclude each other through `<out>.lock`, a second writer fails at once
(exit 2, naming the holder), and an append writes into the directory it locked or refuses (exit 2) when the name
--out no longer leads there.

The races are run with two real processes: the first writer stops at lock.py's test hook (it reads a FIFO to its
end once it holds the lock), the test knows it has got there when its own non-blocking open of the FIFO for writing
succeeds (a FIFO has a reader only then), runs the second writer, and closes the FIFO to let the first go on."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from data_helpers import read_texts, write_jsonl
from minilmd.corpus.prepare.lock import HOLD_FOR_TEST

pytestmark = pytest.mark.slow  # every test races real `minilmd prepare` processes

CLI = [sys.executable, "-m", "minilmd.cli"]


def prepare_cli(sources, out: Path, *extra: str) -> list[str]:
    fraction = [] if "--append" in extra else ["--val-fraction", "0.1"]
    return [*CLI, "prepare", *map(str, sources), "--out", str(out), "--workers", "0", *fraction, *extra]


def run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def report_ok(root: Path) -> None:
    done = run([*CLI, "corpus", "report", str(root), "--workers", "0"])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def texts(demo_jsonl) -> list[str]:
    return read_texts(demo_jsonl[:1])


class Blocked:
    """A writer process started with the lock.py test hook: once `wait_holding` returns it holds the lock (and has
    opened what it writes) and waits on a FIFO, until `release`."""

    def __init__(self, argv: list[str], tmp_path: Path):
        self.fifo = tmp_path / "hold.fifo"
        os.mkfifo(self.fifo)
        env = {**os.environ, HOLD_FOR_TEST: str(self.fifo)}
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.fd = -1

    def wait_holding(self) -> None:
        import time

        deadline = time.monotonic() + 300
        while self.fd < 0:
            try:
                self.fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)  # succeeds once it has a reader
            except OSError as e:
                assert e.errno == errno.ENXIO, e
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    _, err = self.proc.communicate()
                    pytest.fail(f"the first writer never reached its hold (rc {self.proc.returncode}): {err}")
                time.sleep(0.05)

    def release(self) -> subprocess.CompletedProcess:
        os.close(self.fd)  # its read of the FIFO ends: it goes on
        out, err = self.proc.communicate(timeout=300)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


def test_force_during_an_append_is_refused_and_the_append_completes(tmp_path, texts, tokenizer):
    root = tmp_path / "corpus"
    a = write_jsonl(tmp_path / "a.jsonl", texts[:150])
    assert run(prepare_cli([a], root, "--tokenizer", str(tokenizer))).returncode == 0
    new = write_jsonl(tmp_path / "new.jsonl", texts[150:200])
    appending = Blocked(prepare_cli([new], root, "--append"), tmp_path)
    appending.wait_holding()
    forced = run(prepare_cli([write_jsonl(tmp_path / "b.jsonl", texts[150:])], root, "--tokenizer",
                             str(tokenizer), "--force"))
    appended = appending.release()
    assert forced.returncode == 2, (forced.stderr, appended.stderr)
    assert "another prepare is writing it" in forced.stderr and "prepare --append" in forced.stderr
    assert f"pid {appending.proc.pid}" in forced.stderr
    assert appended.returncode == 0, appended.stderr
    report_ok(root)
    meta = json.loads((root / "meta.json").read_text())
    assert meta["versions"][-1]["sources"] == [str(new)] and meta["sources"][0]["path"] == str(a)


@pytest.mark.parametrize("second", ["append", "prepare"])
def test_a_prepare_holds_out_every_other_writer(tmp_path, texts, tokenizer, second):
    """A --force (over a corpus) or a first prepare (of a new --out) running: an append, or another prepare of
    the same new --out, is refused at once; the first one's corpus is what is left, whole."""
    root = tmp_path / "corpus"
    first = ["--force"]
    if second == "append":
        assert run(prepare_cli([write_jsonl(tmp_path / "a.jsonl", texts[:100])], root, "--tokenizer",
                               str(tokenizer))).returncode == 0
    else:
        first = []
    src = write_jsonl(tmp_path / "src.jsonl", texts[100:200])
    preparing = Blocked(prepare_cli([src], root, "--tokenizer", str(tokenizer), *first), tmp_path)
    preparing.wait_holding()
    other = write_jsonl(tmp_path / "other.jsonl", texts[200:250])
    argv = prepare_cli([other], root, "--append") if second == "append" else \
        prepare_cli([other], root, "--tokenizer", str(tokenizer))
    refused = run(argv)
    prepared = preparing.release()
    assert refused.returncode == 2 and "another prepare is writing it" in refused.stderr, refused.stderr
    assert prepared.returncode == 0, prepared.stderr
    report_ok(root)
    meta = json.loads((root / "meta.json").read_text())
    assert [s["path"] for s in meta["sources"]] == [str(src)] and "versions" not in meta


def test_an_append_refuses_when_its_corpus_is_moved_away_meanwhile(tmp_path, texts, tokenizer):
    """Something other than minilmd swaps the directory under a running append (a copy in its place): the append
    writes into neither, exit 2, and both stay sound."""
    root = tmp_path / "corpus"
    assert run(prepare_cli([write_jsonl(tmp_path / "a.jsonl", texts[:150])], root, "--tokenizer",
                           str(tokenizer))).returncode == 0
    appending = Blocked(prepare_cli([write_jsonl(tmp_path / "new.jsonl", texts[150:200])], root, "--append"),
                        tmp_path)
    appending.wait_holding()
    moved = tmp_path / "moved"
    root.rename(moved)
    shutil.copytree(moved, root)
    appended = appending.release()
    assert appended.returncode == 2 and "replaced or moved while this prepare --append ran" in appended.stderr, \
        appended.stderr
    for corpus in (root, moved):
        report_ok(corpus)
        assert "versions" not in json.loads((corpus / "meta.json").read_text())


@pytest.mark.parametrize("planted", ["symlink", "foreign", "fifo"])
def test_a_planted_lock_file_is_refused(tmp_path, texts, tokenizer, planted):
    out = tmp_path / "corpus"
    lock = tmp_path / "corpus.lock"
    target = tmp_path / "victim.txt"
    target.write_text("her notes\n")
    if planted == "symlink":
        lock.symlink_to(target)
    elif planted == "fifo":
        os.mkfifo(lock)
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the lock file to another user")
        lock.write_text("")
        os.chown(lock, 65534, 65534)
    done = run(prepare_cli([write_jsonl(tmp_path / "a.jsonl", texts[:50])], out, "--tokenizer", str(tokenizer)))
    assert done.returncode == 2, done.stderr
    assert "lock file" in done.stderr, done.stderr
    assert "nothing was changed" in done.stderr or "cannot open the lock file" in done.stderr, done.stderr
    assert not out.exists() and target.read_text() == "her notes\n"


def test_a_users_own_file_of_the_lock_name_is_never_overwritten(tmp_path, texts, tokenizer):
    lock = tmp_path / "corpus.lock"
    lock.write_text("my notes on locks\n")
    done = run(prepare_cli([write_jsonl(tmp_path / "a.jsonl", texts[:50])], tmp_path / "corpus", "--tokenizer",
                           str(tokenizer)))
    assert done.returncode == 2 and "not a lock file of minilmd's" in done.stderr, done.stderr
    assert lock.read_text() == "my notes on locks\n" and not (tmp_path / "corpus").exists()


@pytest.mark.root
def test_append_to_another_users_corpus_is_exit_2_not_a_traceback(tmp_path, texts, tokenizer):
    from second_user import shared_dir, user_python

    shared = shared_dir()
    try:
        root = shared / "corpus"
        assert run(prepare_cli([write_jsonl(tmp_path / "a.jsonl", texts[:100])], root, "--tokenizer",
                               str(tokenizer))).returncode == 0
        new = write_jsonl(shared / "b.jsonl", texts[100:150])
        new.chmod(0o644)
        before = {p.name: p.stat().st_size for p in (root / "train").iterdir()}
        code = "import sys\nfrom minilmd.cli import app\nsys.argv[0] = 'minilmd'\napp()\n"
        done = subprocess.run(user_python(code, "prepare", "--append", str(new), "--out", str(root), "--workers",
                                          "0"), capture_output=True, text=True, cwd="/", timeout=300)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and "belongs to another user (uid 0)" in done.stderr
        assert {p.name: p.stat().st_size for p in (root / "train").iterdir()} == before
        report_ok(root)
    finally:
        shutil.rmtree(shared)


def test_a_link_of_ones_own_to_the_data_directory_still_works(tmp_path, texts, tokenizer):
    """`--out data/corpus` where data is the user's own link to the real directory (an NFS mount, a bigger disk):
    prepare and append go through it; the lock and the corpus are in the real directory."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "data").symlink_to(real)
    out = tmp_path / "data" / "corpus"
    assert run(prepare_cli([write_jsonl(tmp_path / "a.jsonl", texts[:100])], out, "--tokenizer",
                           str(tokenizer))).returncode == 0
    appended = run(prepare_cli([write_jsonl(tmp_path / "b.jsonl", texts[100:150])], out, "--append"))
    assert appended.returncode == 0, appended.stderr
    assert not (real / "corpus.lock").exists()  # made by each writer, removed by it on its way out
    assert len(json.loads((real / "corpus" / "meta.json").read_text())["versions"]) == 2
    report_ok(out)


@pytest.mark.root
@pytest.mark.parametrize("planted", ["file", "fifo"])
def test_another_users_lock_file_she_may_not_open_is_named_his_not_her_directory(texts, tokenizer, planted):
    """hostile6 F5: another user's `OUT.lock` (0644, or a FIFO) in a sticky team directory: her open of it is
    refused (EACCES), which was said as `cannot write in DIR: Permission denied` (exit 74), blaming the directory
    she may write. Now the file at the lock's name is looked at first, and its owner named (exit 2)."""
    from second_user import second_user, shared_dir, user_python

    second_user()
    shared = shared_dir()
    try:
        source = write_jsonl(shared / "a.jsonl", texts[:50])
        tok = shared / "tokenizer.json"
        shutil.copyfile(tokenizer, tok)
        for path in (source, tok):
            path.chmod(0o644)
        lock = shared / "corpus.lock"
        make = ["mkfifo", "-m", "644", str(lock)] if planted == "fifo" else ["sh", "-c", f"umask 022; : > {lock}"]
        subprocess.run(["setpriv", "--reuid=64123", "--regid=64123", "--clear-groups", "--", *make], check=True,
                       timeout=60)
        code = "import sys\nfrom minilmd.cli import app\nsys.argv[0] = 'minilmd'\napp()\n"
        done = subprocess.run(user_python(code, "prepare", str(source), "--tokenizer", str(tok), "--out",
                                          str(shared / "corpus"), "--workers", "0", "--val-fraction", "0.1"),
                              capture_output=True, text=True, cwd="/", timeout=300)
        assert done.returncode == 2, done.stderr
        assert f"{lock}: the lock file of {shared / 'corpus'} is " in done.stderr, done.stderr
        assert "owned by uid 64123, not yours" in done.stderr and "cannot write in" not in done.stderr, done.stderr
        assert not (shared / "corpus").exists() and os.lstat(lock).st_uid == 64123
    finally:
        shutil.rmtree(shared)
