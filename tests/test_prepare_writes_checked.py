"""What `prepare --force` and `prepare --append` check again at the moment they write (issue 40, review): a
prepare may take hours, so what --out held when it was checked is not what it holds when the new corpus is
published; and an append writes into files of the corpus's split directories, which must be the corpus's own.

Each race is run with a real `minilmd prepare` process stopped at lock.py's test hook (it reads a FIFO to its end
once it holds the lock and has checked --out); the test knows it is there when its own non-blocking open of the
FIFO for writing succeeds, changes --out, and closes the FIFO to let it go on."""
from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_helpers import run_prepare
from minilmd.corpus.prepare.lock import HOLD_FOR_TEST

pytestmark = pytest.mark.slow  # real `minilmd prepare` processes

CLI = [sys.executable, "-m", "minilmd.cli", "prepare"]


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes() if path.is_file() and not path.is_symlink() else b"/")
    return h.hexdigest()


class Held:
    """A prepare started with the test hook; `wait` returns once it waits there, `release` lets it finish."""

    def __init__(self, argv: list[str], tmp_path: Path):
        fifo = tmp_path / "hold.fifo"
        os.mkfifo(fifo)
        self.fifo, self.fd = fifo, -1
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, HOLD_FOR_TEST: str(fifo)})

    def wait(self) -> None:
        while self.fd < 0:
            try:
                self.fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)  # succeeds once it has a reader
            except OSError as e:
                assert e.errno == errno.ENXIO, e
                if self.proc.poll() is not None:
                    pytest.fail(f"the prepare never reached its hold: {self.proc.communicate()}")
                time.sleep(0.05)

    def release(self) -> subprocess.CompletedProcess:
        os.close(self.fd)
        out, err = self.proc.communicate(timeout=300)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


def test_force_never_deletes_a_file_added_to_out_while_it_ran(tmp_path, demo_jsonl, tokenizer):
    """--out was an empty directory when --force checked it; her thesis.txt was put there while it prepared. The
    new corpus is published, and the directory it replaced is left whole, beside it, under a name the next
    prepare does not sweep, and said."""
    out = tmp_path / "p"
    out.mkdir()
    held = Held([*CLI, demo_jsonl[0], "--tokenizer", str(tokenizer), "--out", str(out), "--workers", "0",
                 "--val-fraction", "0.1", "--force"], tmp_path)
    held.wait()
    (out / "thesis.txt").write_text("hours of work")
    done = held.release()
    assert done.returncode == 0, done.stderr
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("p.kept-by-prepare.")]
    assert len(kept) == 1 and (kept[0] / "thesis.txt").read_text() == "hours of work", sorted(tmp_path.iterdir())
    assert f"it is at {kept[0]}" in done.stderr and "thesis.txt" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokenizer.json", "train", "val"]
    again = subprocess.run([*CLI, demo_jsonl[1], "--tokenizer", str(tokenizer), "--out", str(out), "--workers",
                            "0", "--val-fraction", "0.1", "--force"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert (kept[0] / "thesis.txt").read_text() == "hours of work"  # not a leftover the next prepare sweeps


@pytest.mark.parametrize("mode", [0o775, 0o777])
def test_append_refuses_a_split_directory_others_can_write(tmp_path, demo_jsonl, tokenizer, mode):
    """train/ writable by others (an older prepare under umask 002 made it 0775): anyone of the group could put a
    link at train/tokens.bin, so the append refuses at once (exit 2, naming it and chmod go-w), nothing changed."""
    corpus = tmp_path / "c"
    run_prepare(demo_jsonl[:1], tokenizer, corpus, val_fraction=0.1)
    (corpus / "train").chmod(mode)
    before = tree_digest(corpus)
    done = subprocess.run([*CLI, demo_jsonl[1], "--append", "--out", str(corpus), "--workers", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert f"{corpus / 'train'}" in done.stderr and "chmod go-w" in done.stderr, done.stderr
    assert tree_digest(corpus) == before


@pytest.mark.parametrize("name", ["train/tokens.bin", "val/doc_lengths.npy"])
def test_append_never_writes_through_a_link_put_in_a_split_while_it_ran(tmp_path, demo_jsonl, tokenizer, name):
    """A link at a split's file (put there while the append ran: by the user's own mistake or a process of hers;
    no one else can write there now) is refused before anything is written: the file it leads to is unchanged,
    the corpus's meta.json too (exit 2)."""
    corpus = tmp_path / "c"
    run_prepare(demo_jsonl[:1], tokenizer, corpus, val_fraction=0.1)
    victim = tmp_path / "victim.bin"
    victim.write_bytes((corpus / name).read_bytes())
    before = victim.read_bytes()
    meta = (corpus / "meta.json").read_bytes()
    held = Held([*CLI, demo_jsonl[1], "--append", "--out", str(corpus), "--workers", "0"], tmp_path)
    held.wait()
    (corpus / name).unlink()
    (corpus / name).symlink_to(victim)
    done = held.release()
    assert victim.read_bytes() == before and (corpus / name).is_symlink()
    assert done.returncode == 2, done.stderr
    assert "nothing was appended" in done.stderr and name.split("/")[1] in done.stderr, done.stderr
    assert (corpus / "meta.json").read_bytes() == meta
