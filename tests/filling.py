"""Another job's file on a small tmpfs that a running run writes to (tests/test_reliability_scratch_full.py,
test_reliability_tmpfs.py, test_reliability_rundir_full.py, test_rundir_full_trainer.py)."""
from __future__ import annotations

import errno
import os
from pathlib import Path


def fill_leaving(disk: Path, room: int, name: str = "another-job") -> Path:
    """Another job's file on the tmpfs, leaving `room` bytes free. The run keeps writing checkpoints meanwhile, so
    the space free when the filler was sized may be gone before it is written (ENOSPC: a flaky test once): the
    filler then takes what it can and gives back what the run took, leaving `room` free all the same."""
    st = os.statvfs(disk)
    filler = disk / name
    with open(filler, "wb", buffering=0) as f:
        left = max(0, st.f_bavail * st.f_frsize - room)
        try:
            while left > 0:
                left -= f.write(b"\0" * min(left, 1 << 20))
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
    st = os.statvfs(disk)
    short = room - st.f_bavail * st.f_frsize
    if short > 0:
        os.truncate(filler, max(0, filler.stat().st_size - short))
    return filler


def fill(disk: Path, name: str = "filler") -> Path:
    """Fill the tmpfs to its last byte. Unbuffered: a buffered file's close flushed again what the disk had just
    refused, and raised ENOSPC out of the `with` (seen in tests/test_rundir_full_ranks.py)."""
    path = disk / name
    with open(path, "wb", buffering=0) as f:
        chunk = b"\0" * (1 << 16)
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
    for size in (4096, 512, 1):  # the last pages, byte by byte at the end
        try:
            with open(path, "ab", buffering=0) as f:
                while True:
                    f.write(b"\0" * size)
                    f.flush()
        except OSError:
            pass
    return path
