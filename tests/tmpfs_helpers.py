"""A real tmpfs as the scratch base, and another user's files using up its inodes: for the tests of a base with no
room (tests/test_scratch_inodes_full.py, tests/test_scratch_wait_held.py). Mounting needs root: skipped elsewhere.
The other user is a real uid (64123, no passwd entry), his files chowned by the test."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from minilmd import names

OTHER = 64123
UID = os.geteuid()


@pytest.fixture
def base(tmp_path, monkeypatch) -> Path:
    """A tmpfs of 8 inodes (its root one of them; 128 MB: the check wants room for the run), mode 1777 as
    /dev/shm, the scratch base; unmounted after."""
    if UID != 0:
        pytest.skip("needs root to mount a tmpfs")
    where = tmp_path / "shm"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m,nr_inodes=8,mode=1777", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    monkeypatch.setenv(names.SCRATCH_BASE_ENV, str(where))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


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
