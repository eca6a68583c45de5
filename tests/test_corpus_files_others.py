"""A prepared corpus's files and other users (hostile audit 6 F2). Under umask 002 (Debian's and Ubuntu's default)
`prepare` made tokens.bin, doc_lengths.npy, tokenizer.json 0664: in a setgid team directory a teammate edited them,
and the next `prepare --append` recorded the tampered file's sha256 in meta.json, so every staging after "verified"
his text. Now: the corpus's files are 0644 whatever the umask; `--append` refuses a corpus whose files another user
can write or owns (exit 2), and checks each old file against meta.json before it records anything (exit 65 on a
mismatch, naming the file); staging's sha256 mismatch says when another user could write the file. The files
`tokenizer train` and `tokenizer template` write keep the same rule (perms.published_file_mode).

The attacker is a real uid (64123, no passwd entry needed) writing through his group: the victim's corpus files are
given his group, 0664, as a setgid team directory and umask 002 give them."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from data_helpers import read_texts, run_prepare, write_jsonl
from minilmd.daemon.jobs.staging import StagingError, stage

OTHER = 64123
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv: another uid writes the victim's file")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def texts(demo_jsonl) -> list[str]:
    return read_texts(demo_jsonl[:1])


@pytest.fixture
def shared():
    """A directory of root's under /tmp (0755) the other uid can reach, removed afterwards (pytest's own are 0700)."""
    path = Path(subprocess.run(["mktemp", "-d", "/tmp/minilmd-files-XXXXXX"], capture_output=True, text=True,
                               check=True).stdout.strip())
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def files_of(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_prepare_makes_no_corpus_file_others_can_write_under_umask_002(tmp_path, texts, tokenizer):
    os.umask(0o002)  # restored by conftest's process_wide_settings_restored
    out = tmp_path / "corpus"
    run_prepare([write_jsonl(tmp_path / "a.jsonl", texts[:100])], tokenizer, out, val_fraction=0.1)
    modes = {str(p.relative_to(out)): stat.S_IMODE(p.stat().st_mode) for p in files_of(out)}
    assert {"meta.json", "tokenizer.json", "train/tokens.bin", "val/doc_lengths.npy"} <= set(modes)
    assert all(mode == 0o644 for mode in modes.values()), modes
    os.umask(0o027)
    run_prepare([write_jsonl(tmp_path / "a.jsonl", texts[:100])], tokenizer, tmp_path / "narrow", val_fraction=0.1)
    assert {stat.S_IMODE(p.stat().st_mode) for p in files_of(tmp_path / "narrow")} == {0o640}


def test_the_tokenizer_commands_write_no_file_others_can_write_under_umask_002(tmp_path, texts, tokenizer):
    """tokenizer train and tokenizer template wrote 0664 files under umask 002 (the umask's mode, perms.file_mode): a
    teammate could edit the victim's tokenizer.json, or the chat template beside it, in a setgid team directory.
    Now the files of a corpus's rule, perms.published_file_mode: 0644 less the umask."""
    os.umask(0o002)  # restored by conftest's process_wide_settings_restored
    trained = tmp_path / "trained" / "tokenizer.json"
    done = cli("tokenizer", "train", str(write_jsonl(tmp_path / "a.jsonl", texts[:100])), "--vocab-size", "300",
               "--out", str(trained), "--chat-template", "minimind")
    assert done.returncode == 0, done.stderr
    copy = tmp_path / "copy"
    done = cli("tokenizer", "template", str(tokenizer), "--chat-template", "minimind", "--out", str(copy))
    assert done.returncode == 0, done.stderr
    written = [trained, trained.with_name("tokenizer_config.json"), copy / "tokenizer.json",
               copy / "tokenizer_config.json"]
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in written} == {str(p): "0o644" for p in written}
    os.umask(0o027)  # a narrower umask narrows it
    done = cli("tokenizer", "template", str(tokenizer), "--chat-template", "minimind", "--out", str(copy), "--force")
    assert done.returncode == 0, done.stderr
    assert {stat.S_IMODE(p.stat().st_mode) for p in written[2:]} == {0o640}


def _tamper(path: Path, as_other: bool) -> None:
    """Overwrite the first document's second and third tokens with other ids of the vocabulary (BOS, EOS and every
    length kept: no invariant of the corpus notices), as uid OTHER when asked (through his group's write bit)."""
    code = (f"import os\nfd = os.open({str(path)!r}, os.O_WRONLY)\n"
            "os.pwrite(fd, (300).to_bytes(2, 'little') + (301).to_bytes(2, 'little'), 2)\n")
    argv = [sys.executable, "-c", code]
    if as_other:
        argv = ["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}", "--clear-groups", "--", *argv]
    subprocess.run(argv, check=True, timeout=60)


@pytest.mark.slow  # two prepares, four appends, each a process of its own
@needs_root
def test_append_refuses_files_others_can_write_then_names_the_one_they_changed(shared, texts, tokenizer):
    out = shared / "corpus"
    done = cli("prepare", str(write_jsonl(shared / "a.jsonl", texts[:100])), "--tokenizer", str(tokenizer),
               "--out", str(out), "--workers", "0", "--val-fraction", "0.1")
    assert done.returncode == 0, done.stderr
    new = write_jsonl(shared / "b.jsonl", texts[100:150])
    tokens = out / "train" / "tokens.bin"
    for path in files_of(out):  # as a setgid team directory of his group and umask 002 made them
        os.chown(path, 0, OTHER)
        path.chmod(0o664)
    _tamper(tokens, as_other=True)  # he could: the group's write bit
    meta = (out / "meta.json").read_bytes()

    done = cli("prepare", "--append", str(new), "--out", str(out), "--workers", "0")
    assert done.returncode == 2, done.stderr
    assert f"is writable by its gid {OTHER}, mode 664: another user could have changed it" in done.stderr, done
    assert "nothing was appended" in done.stderr and (out / "meta.json").read_bytes() == meta

    subprocess.run(["chmod", "-R", "go-w", str(out)], check=True)  # the way on the refusal gives
    done = cli("prepare", "--append", str(new), "--out", str(out), "--workers", "0")
    assert done.returncode == 65, done.stderr
    assert f"{tokens}: its first " in done.stderr and "do not hash to the sha256 meta.json lists" in done.stderr
    assert (out / "meta.json").read_bytes() == meta  # his bytes never get a hash of hers

    os.chown(out / "tokenizer.json", OTHER, OTHER)  # a file of another user's in her corpus
    done = cli("prepare", "--append", str(new), "--out", str(out), "--workers", "0")
    assert done.returncode == 2 and f"tokenizer.json is owned by uid {OTHER}, mode 644" in done.stderr, done.stderr


def test_an_untouched_corpus_still_grows_and_a_changed_one_is_refused(tmp_path, texts, tokenizer):
    out = tmp_path / "corpus"
    run_prepare([write_jsonl(tmp_path / "a.jsonl", texts[:100])], tokenizer, out, val_fraction=0.1)
    done = cli("prepare", "--append", str(write_jsonl(tmp_path / "b.jsonl", texts[100:150])), "--out", str(out),
               "--workers", "0")
    assert done.returncode == 0, done.stderr
    assert len(json.loads((out / "meta.json").read_text())["versions"]) == 2
    _tamper(out / "val" / "tokens.bin", as_other=False)
    meta = (out / "meta.json").read_bytes()
    done = cli("prepare", "--append", str(write_jsonl(tmp_path / "c.jsonl", texts[150:200])), "--out", str(out),
               "--workers", "0")
    assert done.returncode == 65 and f"{out / 'val' / 'tokens.bin'}: its first" in done.stderr, done.stderr
    assert (out / "meta.json").read_bytes() == meta


def test_stagings_sha256_mismatch_says_when_others_can_write_the_file(tmp_path, texts, tokenizer):
    source = tmp_path / "corpus"
    run_prepare([write_jsonl(tmp_path / "a.jsonl", texts[:100])], tokenizer, source, val_fraction=0.1)
    tokens = source / "train" / "tokens.bin"
    tokens.chmod(0o666)
    _tamper(tokens, as_other=False)
    with pytest.raises(StagingError) as err:
        stage(str(source), tmp_path / "shm", retries=0, backoff_s=0)
    assert "sha256" in str(err.value), err.value
    assert f"{source}/train/tokens.bin is writable by every user, mode 666: another user may have changed it" in \
        str(err.value), err.value
