"""Where this machine mounts shares: the places a missing directory means a share not mounted or mistyped, not a
directory the user has still to make (minilmd/path_checks.py remote_parents_refused). A mount parent is a directory
shares are mounted in: the usual ones (/mnt, /media, /net, ...), an autofs master map's directories, and the
directories that hold a configured mount point. A configured mount point is one this machine is set up to mount:
named by /etc/fstab, an autofs direct map, or the `Where=` of a systemd .mount or .automount unit in
/etc/systemd/system or /run/systemd/system. The user's home is never one of them.

All of it is read once per check into a `MountConfig` (`snapshot`, the seam a test fakes; `read_config` reads the
tables under another root). What none of these names is not known: a share mounted by hand (`mount` at a shell),
now gone, leaves an empty directory nothing tells from one a user made; so does an autofs master map included from
NIS or LDAP (`+auto.master`), which is not read, only the files named (`+dir:`, `+/etc/...`) and
/etc/auto.master.d. The tables are root's: read only when owned by root, regular (no link followed) and bounded in
size, their count bounded. Torch-free.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from minilmd.untrusted import Unreadable, dir_names, read_bytes

KNOWN_PARENTS = ("/mnt", "/media", "/run/media", "/net", "/nfs", "/misc", "/shared")
FSTAB = "/etc/fstab"
AUTO_MASTER = "/etc/auto.master"
AUTO_MASTER_D = "/etc/auto.master.d"
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system")
UNIT_SUFFIXES = (".mount", ".automount")
MAX_TABLE_BYTES = 1 << 20
MAX_UNIT_BYTES = 1 << 16
MAX_DIR_ENTRIES = 4096
"""Entries a directory of tables (/etc/auto.master.d, a systemd unit directory) may hold: past it, none is read."""
MAX_FILES = 256
"""Tables read from one such directory at most (a systemd directory holds a few mount units, not thousands)."""
MAX_INCLUDE_DEPTH = 3


@dataclass(frozen=True)
class MountConfig:
    """What this machine is set up to mount, as read at one moment."""
    points: frozenset[str] = field(default_factory=frozenset)
    """Configured mount points: fstab's, autofs direct maps', systemd mount units' `Where=`."""
    autofs_dirs: frozenset[str] = field(default_factory=frozenset)
    """An autofs master map's indirect directories (each entry in one is a share mounted on demand)."""

    def parents(self) -> set[str]:
        """Directories shares are mounted in (never "/", whose every directory is not one: the caller says of "/").
        Not every directory that holds a mount point now: a container's volume at /workspace/data, a user's FUSE
        mount in /tmp, a test's, would make every new remote beside it a refusal (review10e F5)."""
        found = set(KNOWN_PARENTS) | self.autofs_dirs | {os.path.dirname(p) for p in self.points}
        return {p for p in found if p != "/"}

    def names(self, path: str) -> bool:
        """`path` is named as a share's mount point: by fstab, an autofs map (an indirect directory's entry too)
        or a systemd unit. An empty directory nothing names is no share's that the configuration knows."""
        return path in self.points or os.path.dirname(path) in self.autofs_dirs

    def is_stub(self, path: str) -> bool:
        """`path` is where a share is set up to be mounted: named (`names`), or root's (not the user's: mount points
        are made by root) inside a mount parent, where a share mounted by hand has its mount point."""
        if self.names(path):
            return True
        try:
            owner = os.lstat(path).st_uid
        except OSError:
            return False
        return owner == 0 and any(path.startswith(p + os.sep) for p in self.parents())


def snapshot() -> MountConfig:
    """This machine's configuration, read now: the one seam of every check (tests fake it)."""
    return read_config()


def read_config(root: str = "/", owner: int = 0) -> MountConfig:
    """The tables under `root` ("/" but in tests), each read only when `owner`'s."""
    tables = _Tables(root, owner)
    fstab = {f[1] for f in tables.lines(FSTAB) if len(f) > 1 and f[1].startswith("/")}
    autofs_dirs, direct = tables.autofs()
    points = {os.path.normpath(p) for p in fstab | direct | tables.unit_points()}
    return MountConfig(frozenset(points), frozenset(autofs_dirs))


class _Tables:
    def __init__(self, root: str, owner: int):
        self.root, self.owner = root, owner

    def _at(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def text(self, path: str, max_bytes: int = MAX_TABLE_BYTES) -> str:
        """A root-owned table's text, "" when it is not there or cannot be read (a link, another's, too big)."""
        try:
            return read_bytes(self._at(path), max_bytes=max_bytes, owner=self.owner).decode("utf-8", "replace")
        except (OSError, Unreadable):
            return ""

    def lines(self, path: str) -> list[list[str]]:
        """The fields of each line of a table (fstab, an autofs map), comments dropped."""
        lines = (line.split("#", 1)[0].split() for line in self.text(path).splitlines())
        return [fields for fields in lines if fields]

    def dir_files(self, folder: str, suffixes: tuple[str, ...]) -> list[str]:
        """Paths of the files in `folder` whose names end in one of `suffixes`, MAX_FILES at most, sorted; none
        when it cannot be listed or holds more than MAX_DIR_ENTRIES entries."""
        try:
            found = dir_names(self._at(folder), max_entries=MAX_DIR_ENTRIES)
        except Unreadable:
            return []
        return [os.path.join(folder, n) for n in sorted(n for n in found if n.endswith(suffixes))[:MAX_FILES]]

    def autofs(self) -> tuple[set[str], set[str]]:
        """(the master maps' indirect directories, the mount points their direct maps name): /etc/auto.master,
        /etc/auto.master.d's *.autofs, and the files they include."""
        parents: set[str] = set()
        points: set[str] = set()
        seen: set[str] = set()
        for master in [AUTO_MASTER, *self.dir_files(AUTO_MASTER_D, (".autofs",))]:
            self._master(master, parents, points, seen, 0)
        return parents, points

    def _master(self, path: str, parents: set[str], points: set[str], seen: set[str], depth: int) -> None:
        if path in seen or depth > MAX_INCLUDE_DEPTH:
            return
        seen.add(path)
        for fields in self.lines(path):
            key = fields[0]
            if key.startswith("+dir:"):
                for included in self.dir_files(key[len("+dir:"):], (".autofs",)):
                    self._master(included, parents, points, seen, depth + 1)
            elif key.startswith("+"):  # a master map included by name: read when it is a file (NIS, LDAP: not)
                if included := _map_file(key[1:]):
                    self._master(included, parents, points, seen, depth + 1)
            elif key == "/-" and len(fields) > 1:
                if direct := _map_file(fields[1]):
                    points |= {f[0] for f in self.lines(direct) if f[0].startswith("/")}
            elif key.startswith("/"):
                parents.add(os.path.normpath(key))

    def unit_points(self) -> set[str]:
        """The `Where=` of the systemd .mount and .automount units in UNIT_DIRS (regular files only: a link, to a
        vendor unit or anywhere, is not followed)."""
        points = set()
        for folder in UNIT_DIRS:
            for unit in self.dir_files(folder, UNIT_SUFFIXES):
                points |= _where(self.text(unit, MAX_UNIT_BYTES))
        return points


def _map_file(spec: str) -> str:
    """The file an autofs map spec names ("/etc/auto.direct", "file:/etc/auto.direct", "file,sun:/..."); "" for
    one of another kind (nis:, ldap:, a bare name looked up by nsswitch, a program map's "program:")."""
    kind, _, path = spec.rpartition(":")
    if kind and kind.split(",")[0] != "file":
        return ""
    return path if path.startswith("/") else ""


def _where(unit: str) -> set[str]:
    """The absolute `Where=` of a unit's [Mount] or [Automount] section."""
    found, section = set(), ""
    for line in unit.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section in ("[Mount]", "[Automount]") and line.startswith("Where="):
            where = line[len("Where="):].strip()
            if where.startswith("/"):
                found.add(where)
    return found
