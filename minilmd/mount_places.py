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
size, their count bounded. Whether a configured mount point has its share mounted now is /proc/self/mountinfo's to
say (`unmounted_point`, `is_mount_point`: why not st_dev there). Torch-free.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from minilmd import mounts
from minilmd.perms import root_owned
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
    named_in: tuple[tuple[str, str], ...] = ()
    """(an autofs directory or mount point, the table that names it first), for the words (`named_by`)."""

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

    def named_by(self, path: str) -> str:
        """The table that names `path` (`names`) as a mount point, in words: "/etc/fstab", a unit's or a map's
        file, "/etc/auto.master (an entry of its autofs directory /net)"; "a mount table" when not recorded."""
        tables = dict(self.named_in)
        if path in self.points:
            return tables.get(path, "a mount table")
        above = os.path.dirname(path)
        return f"{tables.get(above, 'an autofs master map')} (an entry of its autofs directory {above})"

    def is_stub(self, path: str) -> bool:
        """`path` is where a share is set up to be mounted: named (`names`), or root's (not the user's: mount points
        are made by root) inside a mount parent, where a share mounted by hand has its mount point."""
        if self.names(path):
            return True
        try:
            st = os.lstat(path)
        except OSError:
            return False
        return root_owned(st) and any(path.startswith(p + os.sep) for p in self.parents())


def snapshot() -> MountConfig:
    """This machine's configuration, read now: the one seam of every check (tests fake it)."""
    return read_config()


def read_config(root: str = "/", owner: int = 0) -> MountConfig:
    """The tables under `root` ("/" but in tests), each read only when `owner`'s."""
    tables = _Tables(root, owner)
    for fields in tables.lines(FSTAB):
        if len(fields) > 1 and fields[1].startswith("/"):  # a space or a tab in it written \040, \011 (fstab(5))
            tables.name(mounts.unescape(fields[1].encode()), FSTAB)
    autofs_dirs = tables.autofs()
    tables.unit_points()
    named = tuple(tables.dir_named.items()) + tuple(tables.named.items())  # a point's own table said over a map's
    return MountConfig(frozenset(tables.named), frozenset(autofs_dirs), named)


def is_mount_point(path: str) -> bool:
    """Something is mounted on `path` now: /proc/self/mountinfo lists its real path (`unmounted_point` says why
    that and not st_dev); os.path.ismount's st_dev when mountinfo cannot be read."""
    known = mounts.read_mounts(mounts.MOUNTINFO)
    if not known:
        return os.path.ismount(path)
    return os.path.realpath(path) in {m.point for m in known}


def unmounted_point(path: str, config: MountConfig) -> str:
    """The directory at or above `path` that `config` names as a mount point (`names`) while nothing is mounted on
    it now, when `path` lies there rather than on a mount at or below it: what is made or written at `path` then
    goes to the local disk under the mount point, hidden below the share once it is mounted. "" when the nearest
    mount point at or above `path` comes first, when that named directory lies on an automounter's mount (autofs:
    its share is mounted when it is entered), or when /proc/self/mountinfo cannot be read (nothing is known).
    Links in `path` followed (its real path, as the kernel resolves it; what is missing is taken as written).

    Mounted means listed in /proc/self/mountinfo, not a st_dev other than its parent's (os.path.ismount): a bind
    mount of a directory of the same file system has its parent's st_dev and is a mount point all the same (an
    fstab `bind` entry), a btrfs subvolume has a st_dev of its own and is none, and reading mountinfo never touches
    the share (a stat of a stalled NFS mount point blocks). An automounted place lies on an autofs mount before its
    share is mounted on its first access: an autofs direct map's or a systemd .automount unit's mount point is one
    (listed as autofs), an indirect map's entry lies on its directory's; the automounter answers there."""
    known = mounts.read_mounts(mounts.MOUNTINFO)
    if not known:
        return ""
    points = {m.point for m in known}
    here = os.path.realpath(path)
    while here not in points:
        if config.names(here):
            held = mounts.mount_at(here, known)
            return "" if held is not None and held.fstype == "autofs" else here
        if os.path.dirname(here) == here:
            return ""
        here = os.path.dirname(here)
    return ""


class _Tables:
    def __init__(self, root: str, owner: int):
        self.root, self.owner = root, owner
        self.named: dict[str, str] = {}
        """Each mount point read, with the table that named it first."""
        self.dir_named: dict[str, str] = {}
        """Each autofs indirect directory, with the master map that named it first."""

    def name(self, point: str, table: str) -> None:
        self.named.setdefault(os.path.normpath(point), table)

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

    def autofs(self) -> set[str]:
        """The master maps' indirect directories (/etc/auto.master, /etc/auto.master.d's *.autofs, and the files
        they include), each `name`d; so are the mount points their direct maps name."""
        parents: set[str] = set()
        seen: set[str] = set()
        for master in [AUTO_MASTER, *self.dir_files(AUTO_MASTER_D, (".autofs",))]:
            self._master(master, parents, seen, 0)
        return parents

    def _master(self, path: str, parents: set[str], seen: set[str], depth: int) -> None:
        if path in seen or depth > MAX_INCLUDE_DEPTH:
            return
        seen.add(path)
        for fields in self.lines(path):
            key = fields[0]
            if key.startswith("+dir:"):
                for included in self.dir_files(key[len("+dir:"):], (".autofs",)):
                    self._master(included, parents, seen, depth + 1)
            elif key.startswith("+"):  # a master map included by name: read when it is a file (NIS, LDAP: not)
                if included := _map_file(key[1:]):
                    self._master(included, parents, seen, depth + 1)
            elif key == "/-" and len(fields) > 1:
                if direct := _map_file(fields[1]):
                    for point in (f[0] for f in self.lines(direct) if f[0].startswith("/")):
                        self.name(point, direct)
            elif key.startswith("/"):
                parents.add(os.path.normpath(key))
                self.dir_named.setdefault(os.path.normpath(key), path)

    def unit_points(self) -> None:
        """The `Where=` of the systemd .mount and .automount units in UNIT_DIRS, each `name`d (regular files only: a
        link, to a vendor unit or anywhere, is not followed)."""
        for folder in UNIT_DIRS:
            for unit in self.dir_files(folder, UNIT_SUFFIXES):
                for point in _where(self.text(unit, MAX_UNIT_BYTES)):
                    self.name(point, unit)


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
