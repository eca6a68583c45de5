"""Lease files in a directory that every user's runs share (`gpu.lock_dir`): one flock'd file per device, so that
two runs on the server, whoever started them, never hold one device.

The directory is like /tmp: whoever comes first creates it 01777 (sticky: each user may remove or rename only
their own files in it), and anyone may have made it first, with anything inside. So no name is trusted:
- every lease file is opened with O_NOFOLLOW (a symlink named like a lease file is refused, never followed),
  O_NONBLOCK (a FIFO planted there cannot block us), O_NOCTTY and close-on-exec, at the lock directory's
  descriptor;
- the lock directory keeps the place rule (minilmd/place_rule.py, the one home of "may another user rearrange
  this directory"): it and every directory above it root's or ours, none another user can rearrange (sticky where
  others may write; a symlink on the way root's or ours, where it leads held to the same rule): the owner of a
  sticky directory, or of any directory above it, could still remove or swap every lease in it. It is reached,
  and made where missing, by the rule's walk from "/" by descriptors (place_rule.walk_to), never by a path a
  link planted after a check would lead elsewhere. `lock_dir_problem` says why one is refused; `run --check` and
  the launch refuse it (exit 2, daemon/preflight.py) rather than wait;
- a lease file is created O_EXCL by its first user, who owns it (0644 whatever the umask: every user's runs must
  be able to open it). An existing one must be a regular file with a single link (fstat after the open): a FIFO,
  a device or a hard link to some other file is refused;
- the body (JSON: run, pid, host, since) is written only by the file's owner, when it takes the lease. Any other
  user opens the file read-only and only flocks it (an flock needs no write permission); who holds a lease is the
  flock's holder in /proc/locks, and the body names its run when that holder wrote it.
Nothing here chmods a file it did not create, nor writes or truncates another user's file. Torch-free.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from minilmd.perms import owned_by_me, user_words
from minilmd.place_rule import PlaceRefused, place_problem, walk_to
from minilmd.proc_info import flock_holders
from minilmd.untrusted import NO_FOLLOW_NO_BLOCK as OPEN_FLAGS
from minilmd.untrusted import loads

"""Every open of a lease file (at the lock directory's descriptor)."""
SHARED_DIR_MODE = 0o1777
"""The lock directory as its first user creates it: every user's runs create their lease files in it, like /tmp."""
LEASE_MODE = 0o644
"""A lease file as its owner creates it: read (and flocked) by every other user's runs, written by its owner only."""
ADVICE = ("remove it, or set gpu.lock_dir to a directory in which no other user can replace files (an admin makes "
          "the shared one: install -d -m 1777 -o root -g root /var/lib/minilmd-gpu-locks; docs/operations.md)")


class LeaseUnsafe(Exception):
    """The lease cannot be taken without trusting a file another user controls; the message says which and why."""


@dataclass
class LeaseFile:
    fd: int
    path: Path
    writable: bool
    """The file is ours (we created it, or it belongs to us): only then is its body written or truncated."""

    def close(self) -> None:
        os.close(self.fd)


def open_lease(lock_dir: Path, name: str) -> LeaseFile:
    """The lease file `name` in lock_dir, created (with lock_dir) if missing. LeaseUnsafe when the directory or the
    file could be another user's trap; OSError when the file system refuses (permission, read-only, full)."""
    dir_fd = _open_dir(lock_dir)
    try:
        return _open_in(dir_fd, lock_dir / name, name)
    finally:
        os.close(dir_fd)


def try_lock(lease: LeaseFile, exclusive: bool) -> bool:
    """An flock without waiting: False if another open file holds a conflicting one."""
    try:
        fcntl.flock(lease.fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def write_body(lease: LeaseFile, body: dict) -> None:
    """Say who holds the lease, in a file of ours; another user's file keeps its body (the holder shows in
    /proc/locks all the same)."""
    if lease.writable:
        os.ftruncate(lease.fd, 0)
        os.pwrite(lease.fd, json.dumps(body).encode(), 0)


def clear_body(lease: LeaseFile) -> None:
    """Empty our own file's body as the lease ends, so that no stale holder is ever described."""
    if lease.writable:
        try:
            os.ftruncate(lease.fd, 0)
        except OSError:
            pass  # the lease ends anyway when the file is closed


def describe_holder(lease: LeaseFile) -> str:
    """Who holds this (held) lease: "run X pid Y on HOST" from the body when its writer is the flock's holder,
    else "pid P (user U)" from /proc/locks."""
    body = _read_body(lease.fd)
    st = os.fstat(lease.fd)
    holders = flock_holders(st)  # the one reader of /proc/locks (minilmd/proc_info.py)
    pid = body.get("pid")
    if isinstance(pid, int) and (pid in holders or not holders):
        host = body.get("host")
        return f"run {body.get('run') or '?'} pid {pid}" + (f" on {host}" if host else "")
    if holders:
        return f"pid {holders[0]} ({user_words(_process_uid(holders[0]))})"
    return f"another process (the lease file belongs to {user_words(st.st_uid)})"


def lease_body(run: str, host: str) -> dict:
    return {"run": run, "pid": os.getpid(), "host": host, "since": time.time()}


# --- opening without trusting a name ---------------------------------------------------------------------------

LABEL, WHAT = "the lock directory", "the lease files"
"""How the place rule's messages name the lock directory and what is at stake in it."""
WAY_MODE = 0o755
"""The missing directories on the way to a new lock directory, and the lock directory until it is judged, made so
whatever the umask (the run's permission policy, minilmd/perms.py, would make them 0700): every user's runs must
reach the lock directory through them."""


def lock_dir_problem(path: str | os.PathLike) -> str | None:
    """Why the lock directory at path must not be used, or None: the place rule (minilmd/place_rule.py), for it
    and every directory above it, as `_open_dir`'s walk keeps it. A missing one is fine when the directories above
    it are (it is made at the first lease); nothing is created here."""
    path = Path(os.path.abspath(path))
    try:
        problem = place_problem(LABEL, path, WHAT, ADVICE, dir_itself=True, own_links=True)
        if problem is None and os.path.lexists(path) and not os.path.isdir(path):  # links on the way judged: ours
            problem = f"{LABEL} {path} is not a directory; {ADVICE}"
    except OSError as e:
        problem = f"{LABEL} {path} cannot be checked: {e.strerror or e}"
    return problem


def _open_dir(path: Path) -> int:
    """A descriptor of the lock directory, reached from "/" by the place rule's walk (place_rule.walk_to): each
    directory judged on its descriptor, a link followed only when root's or ours, a missing one made at its judged
    parent (WAY_MODE exactly), never by a path that a link planted after a check by path would lead elsewhere (his
    link at a missing parent put the lock directory in her private one). The lock directory's own verdict is the
    place rule's too: no stricter one is needed, since other users' runs only add lease files in it, which the
    sticky bit keeps theirs; a directory no one else may write (0755, or 0775 of a group of this user's alone) only
    keeps their runs from leasing through it. One made here is made shared (SHARED_DIR_MODE) once judged. The
    judgement by path first only words a refusal as `run --check` does; the walk's is the one that holds."""
    problem = lock_dir_problem(path)  # the same words as `run --check`'s for what is there already
    if problem:
        raise LeaseUnsafe(problem)
    made: list[Path] = []
    try:
        fd, real = walk_to(path, LABEL, WHAT, ADVICE, WAY_MODE, exact_mode=True, made=made)
    except PlaceRefused as e:
        raise LeaseUnsafe(str(e)) from None
    if made and made[-1] == real:
        try:
            os.fchmod(fd, SHARED_DIR_MODE)  # ours, just made and judged: every user's runs add their leases here
        except BaseException:
            os.close(fd)
            raise
    return fd


def _open_in(dir_fd: int, path: Path, name: str) -> LeaseFile:
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, LEASE_MODE, dir_fd=dir_fd)
    except FileExistsError:
        pass  # a lease file made earlier, by us or another user (or a symlink: O_EXCL never follows one)
    else:
        os.fchmod(fd, LEASE_MODE)  # made just now, by us: readable by every user's runs whatever our umask
        return LeaseFile(fd, path, writable=True)
    try:
        fd = os.open(name, os.O_RDONLY | OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LeaseUnsafe(f"{path} is a symbolic link (never followed: it could point at any file); "
                              f"{ADVICE}") from None
        raise
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_nlink != 1:
        problem = f"has {st.st_nlink} hard links (it could be another file's name)"
    if problem:
        os.close(fd)
        raise LeaseUnsafe(f"{path} (of {user_words(st.st_uid)}) {problem}; {ADVICE}")
    if not owned_by_me(st):
        return LeaseFile(fd, path, writable=False)  # another user's lease file: flocked and read, never written
    try:  # our own file: the same open file again, writable (no second lookup of the name)
        rw = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return LeaseFile(fd, path, writable=False)
    os.close(fd)
    return LeaseFile(rw, path, writable=True)


# --- who holds it ----------------------------------------------------------------------------------------------

def _read_body(fd: int) -> dict:
    try:
        body = loads(os.pread(fd, 4096, 0) or b"{}", expect=None)  # another user's file: never RecursionError
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _process_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None

