"""Two processes of one user taking one lock while an older run's wide (0644) lock file is narrowed and replaced
(minilmd/lockfile.py `private`, `replace`; minilmd/scratch_hold.py): the other's whole take runs inside this one's
window, by patching the step before it, and afterwards exactly one holds the file the name leads to (review12c F2,
F3: before, both held)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minilmd import lockfile, scratch_hold
from minilmd.names import SCRATCH_OWNER


def _dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def test_a_take_between_the_mode_read_and_the_chmod_leaves_one_holder(tmp_path, monkeypatch):
    """F3: B has read the old file's wide mode when A's whole take (narrow, replace, lock) runs; B then locks the
    old file, free and no longer named: it must not put a fresh file over A's."""
    lock = tmp_path / "supervisor.lock"
    lock.write_bytes(b"")
    os.chmod(lock, 0o644)
    real, taken_a = os.fchmod, []

    def a_takes_first(fd: int, mode: int) -> None:
        if not taken_a and mode == lockfile.LOCK_FILE_MODE:
            monkeypatch.setattr(os, "fchmod", real)
            taken_a.append(lockfile.take(_dir(tmp_path), lock.name, b'{"pid": 1}'))
        real(fd, mode)

    monkeypatch.setattr(os, "fchmod", a_takes_first)
    try:
        with pytest.raises(lockfile.Held) as held:
            lockfile.take(_dir(tmp_path), lock.name, b'{"pid": 2}')
        assert held.value.body == {"pid": 1}
        assert os.fstat(taken_a[0].fd).st_ino == os.lstat(lock).st_ino
    finally:
        for taken in taken_a:
            os.close(taken.fd)


def test_a_scratch_marker_moved_between_the_open_and_the_flock_is_opened_again(tmp_path, monkeypatch):
    """F2: supervisor B has opened an older run's wide marker when A's hold moves it to a fresh file and lets the
    old one go; B's flock on the old, no longer named file succeeded and both held the scratch. Now B opens the
    name again and finds A's hold."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    marker = scratch / SCRATCH_OWNER
    marker.write_bytes(b'{"run_dir": "/x"}')
    os.chmod(marker, 0o644)
    dir_fd = _dir(scratch)
    real, ran_a = lockfile.private, []

    def a_holds_first(where, name, fd, *args, **kwargs):
        if not ran_a:
            ran_a.append(True)
            scratch_hold._hold(scratch, "A", dir_fd)
        return real(where, name, fd, *args, **kwargs)

    monkeypatch.setattr(lockfile, "private", a_holds_first)
    monkeypatch.setattr(scratch_hold, "PROBE_WAIT_S", 0.2)
    try:
        with pytest.raises(scratch_hold.ScratchInUse):
            scratch_hold._hold(scratch, "B", dir_fd)
        assert "B" not in scratch_hold._holds
        assert scratch_hold._holds["A"][2] == os.lstat(marker).st_ino
    finally:
        for key in ("A", "B"):
            if (held := scratch_hold._holds.pop(key, None)) is not None:
                os.close(held[0])
        os.close(dir_fd)
