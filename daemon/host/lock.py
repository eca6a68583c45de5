"""One supervisor per run directory: an flock on `<run dir>/supervisor.lock` with a JSON body saying who holds it.

The kernel releases an flock when its holder dies, so a lock file left by a dead supervisor (SIGKILL, power cut of
the process, OOM kill) is simply not held: the next supervisor takes it over without any pid guessing. The body
({pid, host, since, launch_id}) is only there to tell a second supervisor, `minilmd status` and `minilmd stop` who
owns the run; `stop` signals the pid it names only once minilmd/procs.py has proven it holds this lock and carries
the launch id (its supervisor id) in its environment. The descriptor is opened close-on-exec, so a trainer child
never inherits the lock and cannot keep it alive after its supervisor died. The file is opened without following a
symlink and checked (a regular file of ours, one link) before anything is written to it: a run directory another
user can write into must not make the supervisor overwrite some other file through a link planted as
supervisor.lock. Torch-free.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from minilmd.names import LOCK
from minilmd.perms import own_uid, owned_by_me
from minilmd.procs import supervisor_id
from minilmd.untrusted import NO_FOLLOW_NO_BLOCK as OPEN_FLAGS
from minilmd.untrusted import loads

"""Never through a symlink, never blocked on a FIFO, never a controlling terminal, never inherited by the trainer."""


@dataclass
class LockInfo:
    pid: int | None
    """Process id of the supervisor that holds (or last held) the lock."""
    host: str
    """Host name of that process: a pid means nothing on another machine."""
    since: float | None
    """Unix time when it took the lock."""
    launch_id: str = ""
    """The supervisor id its environment carries (minilmd/procs.py proves the holder by it); "" if none."""

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)) if self.since else "an unknown time"
        return f"pid {self.pid} on {self.host or 'an unknown host'} since {when}"


class LockHeld(RuntimeError):
    """Another live supervisor owns this run directory."""

    def __init__(self, pid: int | None, host: str, since: float | None, path: Path | None = None):
        self.pid, self.host, self.since, self.path = pid, host, since, path
        info = LockInfo(pid, host, since).describe()
        super().__init__(f"run already owned by another supervisor: {info} (lock {path}); "
                         f"use `minilmd status` to see it or `minilmd stop` to stop it")


class LockUnsafe(RuntimeError):
    """supervisor.lock is not a plain file of ours (a symlink, a FIFO, another user's file): nothing is written."""


def _read_body(fd: int) -> LockInfo:
    """The JSON body of an open lock file; fields are None when the body is empty or unreadable."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096)
        body = loads(raw, expect=None) if raw.strip() else {}  # bounded depth: never RecursionError
    except (OSError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    pid = body.get("pid")
    since = body.get("since")
    launch_id = body.get("launch_id")
    return LockInfo(pid if isinstance(pid, int) else None, str(body.get("host", "")),
                    float(since) if isinstance(since, (int, float)) else None,
                    launch_id if isinstance(launch_id, str) else "")


class RunLock:
    """`RunLock(run_dir).acquire()` or LockHeld; `.release()`. Usable as a context manager."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | OPEN_FLAGS, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LockUnsafe(f"{self.path} is a symbolic link: not followed; remove it (only this run's "
                                 f"supervisor makes that file)") from None
            raise
        problem = _unusable(os.fstat(fd))
        if problem:
            os.close(fd)
            raise LockUnsafe(f"{self.path} {problem}: not used; remove it (only this run's supervisor makes that "
                             f"file)")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            info = _read_body(fd)
            os.close(fd)
            raise LockHeld(info.pid, info.host, info.since, self.path) from None
        body = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                           "launch_id": supervisor_id()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, body.encode("utf-8"), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Empty the body (a clean end leaves no stale owner to report) and drop the flock."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_holder(run_dir: str | os.PathLike, dir_fd: int | None = None) -> LockInfo | None:
    """Who owns the run right now (a live supervisor), or None. Never takes the lock for longer than a probe, and
    never creates the run directory: `minilmd status` and `minilmd stop` use it on directories that may not be runs.
    `dir_fd`: the run directory opened (the views': daemon/views/runarg.py open_run), the lock opened through it.
    OSError when the lock cannot be opened."""
    return lock_look(run_dir, dir_fd)[0]


def lock_look(run_dir: str | os.PathLike, dir_fd: int | None = None) -> tuple[LockInfo | None, bool]:
    """(its holder's body, or None; whether the lock is provably free: a regular file whose flock this look took
    and let go at once). A held lock's body may not name its pid yet (pid None: the holder writes it just after its
    flock). (None, False) when there is no lock file, or a link or not a regular file there. OSError when it cannot
    be opened: whether anyone holds it cannot be told (another user's lock of mode 0600)."""
    path = Path(run_dir) / LOCK if dir_fd is None else LOCK
    try:
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP):
            return None, False  # no lock, or a symlink that no supervisor of ours made
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None, False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return _read_body(fd), False
            raise
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None, True
    finally:
        os.close(fd)


def _unusable(st: os.stat_result) -> str | None:
    """Why the lock file must not be taken as this run's (not a regular file, another name's, another user's)."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} hard links (it could be another file's name)"
    if not owned_by_me(st):
        return f"belongs to uid {st.st_uid}, not to you (uid {own_uid()})"
    return None
