"""What a full file system has used up, in words, and whose entries hold it: the one wording of every scratch without
room, whether it shows at the launch's claim (daemon/scratchclaim.py), in the trainer's lock (minilmd/trainer_lock.py),
in a launch's compile caches (daemon/attempt.py) or in the supervisor's wait for room (daemon/phases/spacewait.py).

Inodes or bytes, one rule: fsio.no_inode_left (a tmpfs's inodes used up by another user's empty files is ENOSPC with
bytes to spare: freeing bytes would not help, and the words say so). The place lies where others may write: opened
once, no link followed (OPEN_DIR, O_NONBLOCK), measured and listed through that descriptor, bounded (WHOSE_LOOKS).
Torch-free.
"""
from __future__ import annotations

import contextlib
import os

from minilmd import mounts
from minilmd.dirtree import OPEN_DIR
from minilmd.fsio import no_inode_left
from minilmd.perms import is_own_uid, user_words
from minilmd.untrusted import TooManyEntries, listed

WHOSE_LOOKS = 1000
"""The most entries of a full place whose owners are counted (another user's directory may hold millions)."""


def no_room(e: OSError, near: str | os.PathLike, whose_at: str | os.PathLike | None = None) -> str:
    """A full file system's error with what is used up there: its inodes (freeing bytes would not help) or bytes.
    Measured where the error's file was to go, else at `near` (the place being made's parent: a hand-set run.scratch
    lies on its own file system, not base's); the nearest existing directory up from there. Whose entries fill it:
    counted there, or at `whose_at` (the file system's top, where other users' files lie: the place itself may
    hold only the run's own). A link where a place is said as no place measured, never another directory's
    numbers."""
    named = os.fsdecode(e.filename) if e.filename else ""
    where = os.path.dirname(named) if os.path.isabs(named) else str(near)  # relative: made at near's descriptor
    found = _open_up(where)
    if found is None:
        return f"{e.strerror} ({where})"
    where, fd = found
    try:
        return f"{e.strerror}: {_used_up(where, fd, whose_at)}"
    except OSError:
        return f"{e.strerror} ({where})"
    finally:
        os.close(fd)


def made_in(e: OSError, place: str | os.PathLike) -> bool:
    """Whether the file an OSError could not make lies under `place` (scratch, say, rather than run.dir): which file
    system was full, and so which wait (scratch's) or stop (run.dir's) it is."""
    return bool(e.filename) and os.path.abspath(os.fsdecode(e.filename)).startswith(
        os.path.join(os.path.abspath(place), ""))


def room_now(path: str | os.PathLike) -> str:
    """What the file system holding `path` has left now, and whose entries fill it (counted at its top): the wait's
    words, at each check. "" when it cannot be measured."""
    found = _open_up(str(path))
    if found is None:
        return ""
    where, fd = found
    try:
        return _used_up(where, fd, top_of(where))
    except OSError:
        return ""
    finally:
        os.close(fd)


def inodes_free(path: str | os.PathLike) -> int | None:
    """Inodes a new file of this user's may take on `path`'s file system; None where it does not count them (f_files
    0: btrfs, many NFS servers make them as needed) or it cannot be measured."""
    try:
        vfs = os.statvfs(path)
    except OSError:
        return None
    return vfs.f_favail if vfs.f_files else None


def top_of(path: str | os.PathLike) -> str | None:
    """The mount point of the file system holding `path` (minilmd/mounts.py), where other users' entries that fill it
    lie (/dev/shm, a Slurm node's $TMPDIR); None when no mount names it."""
    found = mounts.mount_of(path)
    return found.point if found else None


def _open_up(where: str) -> tuple[str, int] | None:
    """The nearest existing directory from `where` up, opened (no link followed, never blocking): (its path, fd)."""
    while True:
        try:
            return where, os.open(where, OPEN_DIR | os.O_NONBLOCK)
        except FileNotFoundError:
            if os.path.dirname(where) == where:
                return None
            where = os.path.dirname(where)
        except OSError:
            return None


def _used_up(where: str, fd: int, whose_at: str | os.PathLike | None) -> str:
    vfs = os.fstatvfs(fd)
    owners = _whose_at(whose_at) if whose_at is not None and os.fspath(whose_at) != where else whose(fd)
    if no_inode_left(vfs):
        return f"{where} has no inode left for a new file or directory ({vfs.f_files:,} in all){owners}"
    inodes = f", {vfs.f_favail:,} inodes" if vfs.f_files else ""
    return f"{where} has {vfs.f_bavail * vfs.f_frsize / 1e6:,.1f} MB free{inodes}{owners}"


def _whose_at(place: str | os.PathLike) -> str:
    try:
        fd = os.open(place, OPEN_DIR | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        said = whose(fd)
    finally:
        os.close(fd)
    return said.replace("; its entries:", f"; entries in {os.fspath(place)}:", 1)


def whose(fd: int) -> str:
    """Whose entries the full place (`fd`: its descriptor) holds, by owner, most first ("; its entries: 7 of uid
    64123, 1 of yours"): who holds the room, as far as the place's own entries tell (what lies deeper is not
    counted). Listed bounded (untrusted.listed), each entry looked at through the place's descriptor, no link
    followed; "" when it cannot be listed, a note when it holds more than WHOSE_LOOKS entries."""
    counts: dict[int, int] = {}
    try:
        for name in listed(fd, max_entries=WHOSE_LOOKS):
            with contextlib.suppress(OSError):  # gone since it was listed
                uid = os.stat(name, dir_fd=fd, follow_symlinks=False).st_uid
                counts[uid] = counts.get(uid, 0) + 1
    except TooManyEntries:
        return f"; it holds over {WHOSE_LOOKS} entries (whose, not counted)"
    except OSError:
        return ""
    if not counts:
        return ""
    said = ", ".join(f"{n} of {'yours' if is_own_uid(uid) else user_words(uid)}"
                     for uid, n in sorted(counts.items(), key=lambda kv: -kv[1])[:3])
    return f"; its entries: {said}"
