"""Lease files in a directory that every user's runs share (`gpu.lock_dir`): one flock'd file per device, so that
two runs on the server, whoever started them, never hold one device.

The directory is like /tmp: whoever comes first creates it 01777 (sticky: each user may remove or rename only
their own files in it), and anyone may have made it first, with anything inside. So no name is trusted:
- every lease file is opened with O_NOFOLLOW (a symlink named like a lease file is refused, never followed),
  O_NONBLOCK (a FIFO planted there cannot block us), O_NOCTTY and close-on-exec, at the lock directory's
  descriptor (minilmd/lockfile.py's open, checks and flock, every lock file's);
- the lock directory keeps the place rule (minilmd/place_rule.py, the one home of "may another user rearrange
  this directory"): it and every directory above it root's or ours, none another user can rearrange (sticky where
  others may write; a symlink on the way root's or ours, where it leads held to the same rule): the owner of a
  sticky directory, or of any directory above it, could still remove or swap every lease in it. It is reached,
  and made where missing, by the rule's walk from "/" by descriptors (place_rule.walk_to), never by a path a
  link planted after a check would lead elsewhere. `lock_dir_problem` says why one is refused; `run --check` and
  the launch refuse it (exit 2, daemon/preflight.py) rather than wait;
- a lease file is created O_EXCL by its first user, who owns it (0644 whatever the umask: every user's runs must
  be able to open it). An existing one must be a regular file with a single link (fstat after the open): a FIFO,
  a device or a hard link to some other file is refused; so is one this user's runs cannot open at all (its owner
  chmodded it 600 after his run ended): an flock needs an open file, so no run of a user who cannot read it can
  lease that device through it. Each such file is LeaseUnsafe, its words naming it, its owner and who may remove
  it (`unfit`): its owner or an admin, or this user where the file or the lock directory is hers (sticky: no one
  else). `unfit_leases` says the same of the existing files, nothing made or locked, for `run --check`;
- a lease lasts while its file keeps its name: `keep`, every few seconds while a run holds its cards, checks
  that the name still leads to the file held (and touches a file of ours, so that a cleaner aging /tmp by times
  leaves it); GpuAdmission.keep (daemon/host/leasekeep.py) takes a name gone again; a name that could not be
  looked at (LeaseUnseen) is no name gone, and is looked at again at the next keep;
- the body (JSON: run, pid, host, since) is written only by the file's owner, when it takes the lease. Any other
  user opens the file read-only and only flocks it (an flock needs no write permission); who holds a lease is the
  flock's holder by the kernel's record (minilmd/procs.py flock_holders: /proc/locks, matched on device and inode), and
  the body names its run when that holder wrote it.
Nothing here chmods a file it did not create, nor writes, truncates or touches another user's file. Torch-free.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from minilmd import lockfile
from minilmd.perms import owned_by_me, user_words
from minilmd.place_rule import PlaceRefused, walk_problem, walk_to
from minilmd.procs import flock_holders, process_uids

SHARED_DIR_MODE = 0o1777
"""The lock directory as its first user creates it: every user's runs create their lease files in it, like /tmp."""
LEASE_MODE = 0o644
"""A lease file as its owner creates it: read (and flocked) by every other user's runs, written by its owner only."""
ELSEWHERE = ("set gpu.lock_dir to a directory in which no other user can replace files (an admin makes the shared "
             "one: install -d -m 1777 -o root -g root /var/lib/minilmd-gpu-locks; docs/operations.md)")
ADVICE = f"remove it, or {ELSEWHERE}"
"""The way out of a lock directory, or a lease file in it, that this user may remove (`unfit` words another's)."""


class LeaseUnsafe(Exception):
    """The lease cannot be taken without trusting a file another user controls; the message says which and why."""


class LeaseUnseen(Exception):
    """A held lease's name could not be looked at this time (`keep`); the message says where and why."""


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


def take(lock_dir: Path, name: str) -> LeaseFile | None:
    """The lease `name` in lock_dir held exclusively (opened as open_lease opens it), or None when another holds it
    (or its name kept leading to another file). Held only where the name still leads to the file locked, asked
    after the flock: a lease file removed after our open (by its owner, who made it; by an admin's clean-up) is
    nobody's lease, and the next run to come would make a new file at the name and lock that too: two runs on one
    device (review2 F1)."""
    dir_fd = _open_dir(lock_dir)
    try:
        for _ in range(lockfile.STILL_NAMED_TRIES):
            lease = _open_in(dir_fd, lock_dir / name, name)
            if not try_lock(lease, exclusive=True):
                lease.close()
                return None
            if lockfile.still_named(dir_fd, name, lease.fd):
                return lease
            lease.close()  # the flock of a file no longer named goes with it; the name is opened again
        return None
    finally:
        os.close(dir_fd)


def keep(lease: LeaseFile) -> bool:
    """Whether the name of a held lease still leads to its file (lockfile.still_named, at the lock directory reached
    by the place rule's walk, nothing made), its times then set to now through the held descriptor (futimens) when
    it is her own file; another user's (opened read-only, `writable` False) keeps its times, the check alone. A
    cleaner that ages a directory's files by their times (systemd-tmpfiles before v254, which looks for no flock on
    a file; tmpwatch, tmpreaper, a cron `find -mtime +10 -delete`) removes the file of a lease held for days, or
    made long before by an earlier run and reused since, and the next run to come makes a new file at the name and
    leases the same device (GpuAdmission.keep, every few seconds while a run holds its cards, touches it and
    takes the name again when it is gone). False when the name leads elsewhere, or nowhere (its lock directory gone
    too). LeaseUnseen when it could not be looked at (the walk refused or failed: EACCES, EIO, EMFILE; the stat
    failed): nothing is known then, and the caller looks again at its next keep. Before, such a moment counted as a
    name gone: the run took its own lease's name again, found it flocked (by itself) and said the card lost."""
    try:
        dir_fd, _ = walk_to(lease.path.parent, LABEL, WHAT, ADVICE, None)  # mode None: nothing made on the way
    except FileNotFoundError:
        return False  # the lock directory, or one above it, is gone: its names with it
    except PlaceRefused as e:
        raise LeaseUnseen(str(e)) from None
    except OSError as e:
        raise LeaseUnseen(f"{lease.path.parent}: {e.strerror or e}") from None
    try:
        if not lockfile.still_named(dir_fd, lease.path.name, lease.fd, strict=True):
            return False
    except OSError as e:
        raise LeaseUnseen(f"{lease.path}: {e.strerror or e}") from None
    finally:
        os.close(dir_fd)
    if lease.writable:  # ours: another user's file is not the run's to change, even where root could
        try:
            os.utime(lease.fd)  # atime and mtime now (ctime follows): the file is not old while it is held
        except OSError:
            pass  # a read-only file system: its times stay; still named, it holds
    return True


def try_lock(lease: LeaseFile, exclusive: bool) -> bool:
    """An flock without waiting: False if another open file holds a conflicting one."""
    return lockfile.try_flock(lease.fd, exclusive)


def unlock(lease: LeaseFile) -> None:
    lockfile.unlock(lease.fd)


def write_body(lease: LeaseFile, body: dict) -> None:
    """Say who holds the lease, in a file of ours; another user's file keeps its body (the holder shows in
    /proc/locks all the same)."""
    if lease.writable:
        lockfile.write_body(lease.fd, json.dumps(body).encode())


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
    body = lockfile.read_body(lease.fd)
    st = os.fstat(lease.fd)
    holders = flock_holders(st)  # the kernel's record, matched on device and inode (minilmd/procs.py)
    pid = body.get("pid")
    if isinstance(pid, int) and (pid in holders or not holders):
        host = body.get("host")
        return f"run {body.get('run') or '?'} pid {pid}" + (f" on {host}" if host else "")
    if holders:
        uids = process_uids(holders[0])
        return f"pid {holders[0]} ({user_words(uids[1] if uids else None)})"
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
    and every directory above it, judged by `_open_dir`'s very walk with nothing made (place_rule.walk_problem, a
    file in the way said too): `run --check`, the launch and each lease give one answer however gpu.lock_dir is
    spelled (by path, abspath read `a/link/../locks` as `a/locks`, where the walk, as the kernel, goes up from
    where the link leads). A missing one is fine when the directories above it are (it is made at the first lease);
    nothing is created here."""
    try:
        return walk_problem(path, LABEL, WHAT, ADVICE, in_the_way=True)
    except OSError as e:
        return f"{LABEL} {path} cannot be checked: {e.strerror or e}"


def _open_dir(path: Path) -> int:
    """A descriptor of the lock directory, reached from "/" by the place rule's walk (place_rule.walk_to): each
    directory judged on its descriptor, a link followed only when root's or ours, a missing one made at its judged
    parent (WAY_MODE exactly), never by a path that a link planted after a check by path would lead elsewhere (his
    link at a missing parent put the lock directory in her private one). The lock directory's own verdict is the
    place rule's too: no stricter one is needed, since other users' runs only add lease files in it, which the
    sticky bit keeps theirs; a directory no one else may write (0755, or 0775 of a group of this user's alone) only
    keeps their runs from leasing through it. One made here is made shared (SHARED_DIR_MODE) once judged.
    lock_dir_problem first is this walk with nothing made, so a refusal is worded as `run --check` words it; the
    walk that opens is the one that holds (a directory swapped in between is refused by it)."""
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


def unfit_leases(lock_dir: Path, names: Iterable[str]) -> dict[str, str]:
    """For `run --check`: why each existing lease file among `names` in lock_dir cannot be used by this user's runs
    (LeaseUnsafe's words, as the wait's reason says them), by name. Nothing is made or locked: a missing lock
    directory or lease file is fine (made at the first lease), and a lock directory the place rule refuses is
    lock_dir_problem's to say. A file the open fails on otherwise (EIO) is left to the wait too."""
    try:
        dir_fd, _ = walk_to(lock_dir, LABEL, WHAT, ADVICE, None)  # mode None: nothing made on the way
    except (PlaceRefused, OSError):
        return {}
    found: dict[str, str] = {}
    try:
        for name in names:
            try:
                _open_in(dir_fd, Path(lock_dir) / name, name, make=False).close()
            except LeaseUnsafe as e:
                found[name] = str(e)
            except OSError:
                continue  # missing (made at the first lease), or no words to add to the wait's
    finally:
        os.close(dir_fd)
    return found


def _open_in(dir_fd: int, path: Path, name: str, make: bool = True) -> LeaseFile:
    """The lease file `name` (minilmd/lockfile.py's open and checks): made by us (LEASE_MODE exactly; not without
    `make`: FileNotFoundError) or opened read-write when it is one we may write, else read-only (another user's:
    only flocked and read). LeaseUnsafe (`unfit`) for a file there no lease can be taken through."""
    refused: OSError | None = None
    try:
        fd, _ = lockfile.open_lock(dir_fd, name, mode=LEASE_MODE if make else None)
    except PermissionError as e:  # another user's file, or a directory we may not create in: read-only then
        refused = e
    except OSError as e:
        raise _unsafe_or(e, dir_fd, path, name) from None
    if refused is not None:
        try:
            fd, _ = lockfile.open_lock(dir_fd, name, mode=None, write=False)
        except FileNotFoundError:
            raise refused from None  # nothing there, and nothing could be made: the directory's refusal
        except OSError as e:
            raise _unsafe_or(e, dir_fd, path, name) from None
    st = os.fstat(fd)
    problem = lockfile.problem(st, owner=lockfile.Whose.ANYONE)  # regular, one link: the owner is told apart just below
    if problem:
        os.close(fd)
        raise unfit(path, st, problem, os.fstat(dir_fd))
    return LeaseFile(fd, path, writable=refused is None and owned_by_me(st))


def _unsafe_or(e: OSError, dir_fd: int, path: Path, name: str) -> Exception:
    """LeaseUnsafe for what stands at the lease's name when the open refused it as a file no lease is taken
    through: a symbolic link (ELOOP), or a file this user's runs may not even read (EACCES on the read-only open:
    its owner's mode; the directory's search permission was the walk's). Else `e`, the file system's refusal."""
    if e.errno not in (errno.ELOOP, errno.EACCES):
        return e
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        st = None
    if e.errno == errno.ELOOP:
        link = "is a symbolic link (never followed: it could point at any file)"
        if st is None or not stat.S_ISLNK(st.st_mode):  # gone or replaced since: said as the link it was
            return LeaseUnsafe(f"{path} {link}; {ADVICE}")
        return unfit(path, st, link, os.fstat(dir_fd))
    if st is None:
        return e
    why = lockfile.problem(st, owner=lockfile.Whose.ANYONE) or (
        f"has mode {stat.S_IMODE(st.st_mode):03o}, which your runs cannot open: a lease is an flock on the open "
        f"file, so no run of a user who may not read it (yours included) can lease this device while it is there")
    return unfit(path, st, why, os.fstat(dir_fd))


def unfit(path: Path, st: os.stat_result, problem: str, dir_st: os.stat_result) -> LeaseUnsafe:
    """The one wording of a lease file no lease is taken through: its path, its owner, why (`problem`), and who
    may remove it: this user where the file or the lock directory is hers (the sticky bit lets the directory's
    owner remove anything in it), else its owner or an admin (the sticky bit lets no one else)."""
    if owned_by_me(st) or owned_by_me(dir_st):
        advice = ADVICE
    else:
        who = user_words(st.st_uid)
        advice = (f"ask {who} or an admin to remove it (in the sticky lock directory only they may), or "
                  f"{ELSEWHERE}")
    return LeaseUnsafe(f"{path} (of {user_words(st.st_uid)}) {problem}; {advice}")
