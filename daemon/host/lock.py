"""One supervisor per run directory: an flock on `<run dir>/supervisor.lock` with a JSON body saying who holds it.

The kernel releases an flock when its holder dies, so a lock file left by a dead supervisor (SIGKILL, power cut of
the process, OOM kill) is simply not held: the next supervisor takes it over without any pid guessing. The body
({pid, host, since, launch_id}) is only there to tell a second supervisor, `minilmd status` and `minilmd stop` who
owns the run; `stop` signals the pid it names only once minilmd/procs.py has proven it holds this lock and carries
the launch id (its supervisor id) in its environment. The descriptor is opened close-on-exec, so a trainer child
never inherits the lock and cannot keep it alive after its supervisor died. The file is opened without following a
symlink and checked (a regular file of ours, one link) before anything is written to it: a run directory another
user can write into must not make the supervisor overwrite some other file through a link planted as
supervisor.lock. The file is its owner's alone (lockfile.LOCK_FILE_MODE, 0600), whatever run.share says: before,
0644 under run.share "all", any user opened it read-only and held an flock on it with a `sleep`, and every start of
the run was refused for good, "pid None" (hostile10 F1). An older run's wider file is narrowed and replaced by a
fresh one, and one held by other users' processes only is replaced and taken, said on stderr with who held it
(lockfile.private, strangers). The protocol (those checks, the non-blocking flock, the body read bounded) is
minilmd/lockfile.py's;
the lock is opened through the run directory's descriptor, a missing run directory made by run.dir's place-rule walk
(place_rule.open_run_dir): never a mkdir(parents=True) by a path a link planted on the way would redirect.
Torch-free.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from minilmd import lockfile
from minilmd.dirfd import Dir
from minilmd.names import LOCK
from minilmd.perms import user_words
from minilmd.place_rule import PlaceRefused, open_run_dir
from minilmd.procs import supervisor_id


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
    from_table: bool = False
    """Seen holding the lock in the kernel's lock table (/proc/locks), not read from the lock's body: a look that
    cannot open the lock (daemon/views/lastwords.py); its words say so."""

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)) if self.since else "an unknown time"
        return f"pid {self.pid} on {self.host or 'an unknown host'} since {when}"


class LockHeld(RuntimeError):
    """Another live supervisor owns this run directory."""

    def __init__(self, pid: int | None, host: str, since: float | None, path: Path | None = None,
                 holders: list[tuple[int, int | None]] | None = None):
        self.pid, self.host, self.since, self.path = pid, host, since, path
        info = LockInfo(pid, host, since).describe()
        super().__init__(f"run already owned by another supervisor: {info} (lock {path}{_kernel_says(holders)}); "
                         f"use `minilmd status` to see it or `minilmd stop` to stop it"
                         f"{lockfile.unknown_holder_words(holders or [], path)}")


def _kernel_says(holders: list[tuple[int, int | None]] | None) -> str:
    """", held by process 4242 of user vic (uid 1000)": who holds the lock by the kernel's record, "" when unknown."""
    if not holders:
        return ""
    return ", held by " + ", ".join(f"process {pid} of {user_words(uid)}" for pid, uid in holders)


class LockUnsafe(RuntimeError):
    """supervisor.lock is not a plain file of ours (a symlink, a FIFO, another user's file): nothing is written."""


def _info(body: dict) -> LockInfo:
    """The holder a lock's body names (lockfile.read_body: bounded); fields None when it says nothing of them."""
    pid, since, launch_id = body.get("pid"), body.get("since"), body.get("launch_id")
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
        body = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                           "launch_id": supervisor_id()}).encode("utf-8")
        where = _run_dir(self.path.parent)
        try:
            taken = lockfile.take(where, LOCK, body)  # LOCK_FILE_MODE: never shared (hostile10 F1)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LockUnsafe(f"{self.path} is a symbolic link: not followed; remove it (only this run's "
                                 f"supervisor makes that file)") from None
            raise
        except lockfile.Unsafe as e:
            raise LockUnsafe(f"{self.path} {e.problem}: not used; remove it (only this run's supervisor makes that "
                             f"file)") from None
        except lockfile.Held as e:
            info = _info(e.body)
            raise LockHeld(info.pid, info.host, info.since, self.path, e.holders) from None
        except lockfile.Replaced:
            raise LockUnsafe(f"{self.path} keeps being replaced: not used; check who does it") from None
        finally:
            where.close()
        os.fsync(taken.fd)
        self._fd = taken.fd
        if taken.strangers:
            print(f"minilmd run: {self.path} was {lockfile.strangers_words(taken.strangers, 'supervisor')}",
                  file=sys.stderr, flush=True)

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


def _run_dir(run_dir: Path) -> Dir:
    """The run directory opened once, the lock then opened through it. One there (settled by the supervisor's start,
    place_rule.settle_run_dir) is opened as it is; a missing one is made by run.dir's place-rule walk (never a
    mkdir(parents=True) by path, which a link planted on the way redirects). LockUnsafe when the walk refuses."""
    try:
        return Dir(os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), run_dir)
    except FileNotFoundError:
        pass
    try:
        return Dir(open_run_dir(run_dir), run_dir)
    except PlaceRefused as e:
        raise LockUnsafe(f"{e}: the run lock is not taken there") from None


def lock_holder(run_dir: str | os.PathLike, dir_fd: int | None = None) -> LockInfo | None:
    """Who owns the run right now (a live supervisor), or None. Never takes the lock for longer than a probe, and
    never creates the run directory: `minilmd status` and `minilmd stop` use it on directories that may not be runs.
    `dir_fd`: the run directory opened (the views': daemon/views/runarg.py open_run), the lock opened through it.
    OSError when the lock cannot be opened."""
    return lock_look(run_dir, dir_fd)[0]


def lock_look(run_dir: str | os.PathLike, dir_fd: int | None = None) -> tuple[LockInfo | None, bool]:
    """(its holder's body, or None; whether the lock is provably free: a regular file whose flock this look took
    and let go at once). A held lock's body may not name its pid yet (pid None: the holder writes it just after its
    flock). (None, False) when there is no lock file, or a link or not a regular file there, or when only other
    users' processes than its owner's hold it (lockfile.strangers: an older run's lock file others could read; the
    next start replaces it). OSError when it cannot be opened: whether anyone holds it cannot be told (another
    user's lock of mode 0600)."""
    path = Path(run_dir) / LOCK if dir_fd is None else LOCK
    try:
        fd = os.open(path, os.O_RDONLY | lockfile.LOCK_OPEN, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP):
            return None, False  # no lock, or a symlink that no supervisor of ours made
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, False
        if lockfile.probe_free(fd):
            return None, True
        if lockfile.strangers(fd, unreadable_is_one=False):  # a holder hidden from us (hidepid) may be the owner's
            return None, False  # no supervisor: another user's process holding a lock file it could read
        return _info(lockfile.read_body(fd)), False
    finally:
        os.close(fd)
