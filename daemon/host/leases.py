"""Lease files in a directory that every user's runs share (`gpu.lock_dir`): one flock'd file per device, so that
two runs on the server, whoever started them, never hold one device.

The directory is like /tmp: whoever comes first creates it 01777 (sticky: each user may remove or rename only
their own files in it), and anyone may have made it first, with anything inside. So no name is trusted:
- the directory and every lease file are opened with O_NOFOLLOW (a symlink named like a lease file is refused,
  never followed), O_NONBLOCK (a FIFO planted there cannot block us), O_NOCTTY and close-on-exec;
- a lock directory is used only when it is root's or ours, sticky if other users may write to it, and no
  directory above it can be rearranged by another user (each root's or ours, sticky where others may write; a
  symlink on the way must be root's or ours, and where it leads is held to the same rule): the owner of a sticky
  directory, or of any directory above it, could still remove or swap every lease in it. `lock_dir_problem` says
  why one is refused; `run --check` and the launch refuse it (exit 2, daemon/preflight.py) rather than wait;
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

from minilmd.dirfd import place_problem
from minilmd.fsio import make_missing_dirs
from minilmd.perms import others_can_rearrange, owned_by_me, owned_by_me_or_root
from minilmd.procs import user_words
from minilmd.untrusted import loads

OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""Every open of the lock directory and of a lease file."""
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
    holders = _flock_holders(st.st_ino)
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

def lock_dir_problem(path: str | os.PathLike) -> str | None:
    """Why the lock directory at path must not be used, or None. A missing one is fine when the directories
    above it are (it is made at the first lease); nothing is created here."""
    path = Path(os.path.abspath(path))
    above = _above_problem(path)
    if above:
        return above
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"the lock directory {path} cannot be checked: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"the lock directory {path} is a symbolic link or not a directory (never followed); {ADVICE}"
    problem = _dir_problem(st)
    return f"the lock directory {path} {problem}; {ADVICE}" if problem else None


def _above_problem(path: Path) -> str | None:
    """Why another user could rearrange a directory above the lock directory (or a link on the way): the rule
    every shared place is held to (minilmd/place_rule.py `place_problem`; a link of root's or ours is followed, and
    where it leads is held to the same rule)."""
    return place_problem("the lock directory", path, "the lease files", ADVICE, own_links=True)


def _make_parents(parent: Path) -> None:
    """The missing directories above a new lock directory, made 0755 whatever the umask (the run's permission
    policy, minilmd/perms.py, would make them 0700): every user's runs must reach the lock directory through
    them. Only a directory made here and now is chmodded, never one that exists."""
    for directory in make_missing_dirs(parent, 0o755):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o755)
        finally:
            os.close(fd)



def _open_dir(path: Path) -> int:
    problem = _above_problem(Path(os.path.abspath(path)))
    if problem:
        raise LeaseUnsafe(problem)
    created = False
    try:
        fd = _open_dir_fd(path)
    except FileNotFoundError:
        _make_parents(path.parent)
        try:
            os.mkdir(path, 0o700)  # private until it is opened and checked, then shared
            created = True
        except FileExistsError:
            pass  # another run made it just now
        fd = _open_dir_fd(path)
    try:
        st = os.fstat(fd)
        if created and owned_by_me(st):
            os.fchmod(fd, SHARED_DIR_MODE)
            st = os.fstat(fd)
        problem = _dir_problem(st)
        if problem:
            raise LeaseUnsafe(f"the lock directory {path} {problem}; {ADVICE}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_dir_fd(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | OPEN_FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise LeaseUnsafe(f"the lock directory {path} is a symbolic link or not a directory (never followed); "
                              f"{ADVICE}") from None
        raise


def _dir_problem(st: os.stat_result) -> str | None:
    """Why a directory (the lock directory or one above it) could be rearranged by another user, or None."""
    sticky = bool(st.st_mode & stat.S_ISVTX)
    if not sticky and not owned_by_me_or_root(st):
        return f"belongs to {user_words(st.st_uid)} and is not sticky: that user could swap the lease files"
    if not owned_by_me_or_root(st):
        return (f"belongs to {user_words(st.st_uid)}, not to root or you: sticky or not, its owner could remove or "
                f"swap any lease file in it")
    if others_can_rearrange(st):
        return (f"is writable by other users and not sticky (mode {stat.S_IMODE(st.st_mode):04o}): anyone could "
                f"swap the lease files")
    return None


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


def _flock_holders(inode: int) -> list[int]:
    """Pids holding an flock on the file with this inode, from /proc/locks ("1: FLOCK ADVISORY WRITE <pid>
    <maj>:<min>:<inode> 0 EOF"; waiters, marked "->", skipped)."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode) \
                and parts[4].isdigit():
            pids.append(int(parts[4]))
    return pids


def _process_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None

