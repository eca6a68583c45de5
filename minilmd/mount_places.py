"""Where this machine mounts shares: the places a missing directory means a share not mounted or mistyped, not a
directory the user has still to make (minilmd/path_checks.py remote_parents_refused). A mount parent is a directory
shares are mounted in: the usual ones (/mnt, /media, /net, ...), an autofs master map's directories, and the
directories that hold a mount point by configuration (/etc/fstab, an autofs direct map). A configured mount point is
one /etc/fstab or an autofs map names. The user's home is never one of them. Torch-free.
"""
from __future__ import annotations

import os

from minilmd.untrusted import Unreadable, read_bytes

KNOWN_PARENTS = ("/mnt", "/media", "/run/media", "/net", "/nfs", "/misc", "/shared")
FSTAB = "/etc/fstab"
AUTO_MASTER = "/etc/auto.master"
MAX_TABLE_BYTES = 1 << 20


def _table_lines(path: str) -> list[list[str]]:
    """The fields of each line of a root-owned table (fstab, an autofs map), comments dropped; none when unread."""
    try:
        data = read_bytes(path, max_bytes=MAX_TABLE_BYTES, owner=0)
    except (OSError, Unreadable):
        return []
    lines = (line.split("#", 1)[0].split() for line in data.decode("utf-8", "replace").splitlines())
    return [fields for fields in lines if fields]


def _autofs() -> tuple[set[str], set[str]]:
    """(an autofs master map's indirect directories, the mount points its direct maps name)."""
    parents, points = set(), set()
    for fields in _table_lines(AUTO_MASTER):
        if fields[0] == "/-" and len(fields) > 1 and fields[1].startswith("/"):
            points |= {f[0] for f in _table_lines(fields[1]) if f[0].startswith("/")}
        elif fields[0].startswith("/"):
            parents.add(os.path.normpath(fields[0]))
    return parents, points


def configured_points() -> set[str]:
    """Mount points this machine is set up to mount: /etc/fstab's and autofs direct maps'."""
    fstab = {os.path.normpath(f[1]) for f in _table_lines(FSTAB) if len(f) > 1 and f[1].startswith("/")}
    return fstab | {os.path.normpath(p) for p in _autofs()[1]}


def mount_parents() -> set[str]:
    """Directories shares are mounted in (never "/", whose every directory is not one: the caller says of "/").
    Not every directory that holds a mount point now: a container's volume at /workspace/data, a user's FUSE mount
    in /tmp, a test's, would make every new remote beside it a refusal (review10e F5); a share mounted by hand or
    by a systemd .mount unit, in none of the tables, is not known here."""
    autofs_dirs, _ = _autofs()
    found = set(KNOWN_PARENTS) | autofs_dirs | {os.path.dirname(p) for p in configured_points()}
    return {p for p in found if p != "/"}


def is_configured_stub(path: str, parents: set[str]) -> bool:
    """`path` is where a share is set up to be mounted: named by fstab or an autofs map, or an autofs directory's
    entry, or (root's, not the user's: mount points are made by root) inside a mount parent."""
    if path in configured_points() or os.path.dirname(path) in _autofs()[0]:
        return True
    try:
        owner = os.lstat(path).st_uid
    except OSError:
        return False
    return owner == 0 and any(path.startswith(p + os.sep) for p in parents)
