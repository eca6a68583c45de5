"""A real tmpfs as the scratch base, and another user's files using up its inodes: for the tests of a base with no
room (tests/test_scratch_inodes_full.py, tests/test_scratch_wait_held.py). Mounting needs root: skipped elsewhere.
The other user is a real uid (64123, no passwd entry), his files chowned by the test."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from minilmd import names

OTHER = 64123
UID = os.geteuid()


@pytest.fixture
def base(small_tmpfs, monkeypatch) -> Path:
    """A tmpfs of 64 inodes (its root one of them; 128 MB: the check wants room for the run, in bytes and in inodes:
    one with fewer in all than staging and the trainer's start need is refused, scratch_room.inode_problem), mode 1777
    as /dev/shm, the scratch base; unmounted after (faults_fixtures.small_tmpfs)."""
    where = small_tmpfs("128m", "nr_inodes=64,mode=1777")
    monkeypatch.setenv(names.SCRATCH_BASE_ENV, str(where))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return where


def fill_inodes(base: Path) -> list[Path]:
    """His empty files, until the tmpfs has no inode left (bytes to spare)."""
    made = []
    while True:
        try:
            path = base / f".f{len(made)}"
            path.touch()
        except OSError:
            break
        os.chown(path, OTHER, OTHER)
        made.append(path)
    assert made and os.statvfs(base).f_favail == 0
    return made


def wait_for_words(log: Path, words: str, proc, timeout: float = 120) -> None:
    """Until `words` are in the launch's output `log` (e.g. "waits:", its wait begun), or it ended, or `timeout`:
    then they must be there (the output said, else)."""
    deadline = time.monotonic() + timeout
    while words not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert words in log.read_text(), log.read_text()
