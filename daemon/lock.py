"""One supervisor per run directory: an flock on `<run dir>/supervisor.lock` with a JSON body saying who holds it.

The kernel releases an flock when its holder dies, so a lock file left by a dead supervisor (SIGKILL, power cut of
the process, OOM kill) is simply not held: the next supervisor takes it over without any pid guessing. The body
({pid, host, since}) is only there to tell a second supervisor, `minilmd status` and `minilmd stop` who owns the
run. The descriptor is opened close-on-exec, so a trainer child never inherits the lock and cannot keep it alive
after its supervisor died. Torch-free.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from minilmd.names import LOCK


@dataclass
class LockInfo:
    pid: int | None
    """Process id of the supervisor that holds (or last held) the lock."""
    host: str
    """Host name of that process: a pid means nothing on another machine."""
    since: float | None
    """Unix time when it took the lock."""

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


def _read_body(fd: int) -> LockInfo:
    """The JSON body of an open lock file; fields are None when the body is empty or unreadable."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096)
        body = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (OSError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    pid = body.get("pid")
    since = body.get("since")
    return LockInfo(pid if isinstance(pid, int) else None, str(body.get("host", "")),
                    float(since) if isinstance(since, (int, float)) else None)


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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            info = _read_body(fd)
            os.close(fd)
            raise LockHeld(info.pid, info.host, info.since, self.path) from None
        body = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
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


def lock_holder(run_dir: str | os.PathLike) -> LockInfo | None:
    """Who owns the run right now (a live supervisor), or None. Never takes the lock for longer than a probe, and
    never creates the run directory: `minilmd status` and `minilmd stop` use it on directories that may not be runs."""
    path = Path(run_dir) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return _read_body(fd)
            raise
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
