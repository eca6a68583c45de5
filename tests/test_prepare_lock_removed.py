"""The lock file of a prepare (`<out>.lock`, minilmd/corpus/prepare/lock.py) is removed by the writer that made it
on its way out, whatever the outcome: a prepare that fails (a missing corpus file, a missing tokenizer, bad lines)
leaves nothing beside --out, as `prepare --help` promises ("nothing is written unless 0"). Only the very file it
made, through the directory held open, while it still holds the lock; a lock file it did not make stays; and a
writer whose locked file lost its name meanwhile opens the name again, so the removal never lets two writers in."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_helpers import write_jsonl
from minilmd.corpus.prepare.lock import CorpusLock

CLI = [sys.executable, "-m", "minilmd.cli"]


def prepare(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "prepare", *args, "--out", str(tmp_path / "p2"), "--workers", "0"],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # two real prepare processes
def test_failed_prepares_leave_no_lock_file(tmp_path, tokenizer):
    missing = prepare(tmp_path, str(tmp_path / "no-such.jsonl"), "--tokenizer", str(tokenizer))
    assert missing.returncode != 0, missing.stderr
    src = write_jsonl(tmp_path / "a.jsonl", ["some text here"] * 20)
    no_tokenizer = prepare(tmp_path, str(src), "--tokenizer", str(tmp_path / "no-tokenizer"))
    assert no_tokenizer.returncode != 0, no_tokenizer.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"], (missing.stderr, no_tokenizer.stderr)


def test_only_the_lock_file_this_writer_made_is_removed(tmp_path):
    out, lock_file = tmp_path / "corpus", tmp_path / "corpus.lock"
    with CorpusLock(out, "prepare") as first:
        with pytest.raises(ValueError, match="another prepare is writing it"):
            CorpusLock(out, "prepare --append").__enter__()
        assert lock_file.is_file() and first.created
    assert not lock_file.exists()
    with CorpusLock(out, "prepare --force"):  # the next writer makes its own
        (tmp_path / "other").write_text("someone's\n")
        os.replace(tmp_path / "other", lock_file)  # the name now leads to a file this writer did not make
    assert lock_file.read_text() == "someone's\n"
    lock_file.write_text("")  # left by an older minilmd: empty, ours, not made by the next writer
    with CorpusLock(out, "prepare"):
        pass
    assert lock_file.is_file()


class RemovedUnderIt(CorpusLock):
    """A writer whose first locked file loses its name right after its open (the writer before it removed it on
    its way out): it must open the name again, not write under a lock no one else can see."""

    opens = 0

    def _open_and_lock(self) -> None:
        super()._open_and_lock()
        self.opens += 1
        if self.opens == 1:
            os.unlink(self.out.parent / (self.out.name + ".lock"))


def test_a_writer_whose_lock_file_lost_its_name_opens_the_name_again(tmp_path):
    out = tmp_path / "corpus"
    with RemovedUnderIt(out, "prepare") as lock:
        assert lock.opens == 2
        assert os.stat(tmp_path / "corpus.lock").st_ino == os.fstat(lock.fd).st_ino
        with pytest.raises(ValueError, match="another prepare is writing it"):
            CorpusLock(out, "prepare --append").__enter__()
