"""Which file system holds a path or a device, and what kind it is: the one reader of /proc/self/mountinfo and the
one table of file-system types.

Kinds (`kind()`): a local disk (ext4, xfs, btrfs, overlay ...) and a RAM disk (tmpfs, ramfs: its pages are memory)
are both local, their permission checks made by this kernel with this host's users and groups (`is_local`:
perms.local_fs); a network or FUSE file system (nfs, cifs, ceph, lustre, fuse.* ...) is not, and neither is a type
this table does not know ("unknown"). Scratch counts a RAM disk's files as memory (`is_ram`) and suggests only a
local disk as another scratch (`is_local_disk`).

Finding a mount: a path's is the longest mount point that is a prefix of its real path (links followed), the last
listed of several on one point (the one on top); a device's (a stat's st_dev) is the mount of that device, the one
that also holds the path when one is given (bind mounts of one file system share a device, not a mount point).
/proc/self/mountinfo is read whole, bounded (MAX_MOUNTINFO_BYTES); unreadable or over the bound, no mount is
known, which every caller takes for an unknown file system (never local). Torch-free.
"""
from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field

from minilmd.fdread import read_past_bound

MOUNTINFO = "/proc/self/mountinfo"
MAX_MOUNTINFO_BYTES = 8 << 20
"""A kernel file, but bounded all the same: 8 MiB is some 50,000 mounts, far more than a server has."""

LOCAL_DISK_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "reiserfs", "bcachefs",
                              "overlay", "vfat", "exfat", "ntfs", "ntfs3"})
"""File systems on this host's own block devices (overlay: a container's, over one of them)."""
RAM_TYPES = frozenset({"tmpfs", "ramfs"})
"""File systems whose pages are memory: what they hold counts against the machine's RAM."""
LOCAL_TYPES = LOCAL_DISK_TYPES | RAM_TYPES
"""File systems whose permission checks this host's kernel makes with this host's user and group lists."""
NETWORK_TYPES = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "lustre", "gpfs", "beegfs", "glusterfs",
                           "9p", "afs", "ocfs2", "gfs2", "orangefs", "fuse", "fuseblk"})
"""Network, cluster and FUSE file systems (and every "fuse.*"): another machine or a user's daemon answers for
them, never local."""

KERNEL_TYPES = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                          "securityfs", "pstore", "bpf", "configfs", "efivarfs", "mqueue", "fusectl"})
"""The kernel's views (of processes, devices, cgroups), no storage: no directory a run writes can be made there."""

DEAD_MOUNT_ERRNOS = {
    errno.ENOTCONN: "the share's FUSE daemon is gone",
    errno.ESTALE: "the share's mount holds a stale handle of it, the directory or its export replaced on the server",
}
"""The errors of a mount that no access through it gets past until it is mounted again, what each means: a FUSE
mount whose daemon died answers every access with ENOTCONN; an NFS mount whose handle of a directory its server no
longer knows answers ESTALE (the kernel looks a path up once more, afresh, before it says so: a path that still
gets it is the mount's own). The one list of them: a run.remote root that answers one is waited for as a share gone
(daemon/jobs/sync.py), an init.from that does is unreachable, not wrong (minilmd/init_kinds.py)."""


def renumbers_inodes(fstype: str) -> bool:
    """Whether a file system of that type numbers its inodes anew at each mount: FUSE's (fuse, fuse.*: rclone,
    sshfs, gcsfuse), whose daemon gives them out as it meets each file; not fuseblk's, a block device's."""
    return fstype == "fuse" or fstype.startswith("fuse.")


LOCAL_DISK, RAM_DISK, NETWORK, UNKNOWN = "local disk", "RAM disk", "network or FUSE", "unknown"


def kind(fstype: str) -> str:
    """LOCAL_DISK, RAM_DISK, NETWORK or UNKNOWN: the class of a file-system type as mountinfo names it."""
    if fstype in RAM_TYPES:
        return RAM_DISK
    if fstype in LOCAL_DISK_TYPES:
        return LOCAL_DISK
    if fstype in NETWORK_TYPES or fstype.startswith("fuse."):
        return NETWORK
    return UNKNOWN


def is_local(fstype: str) -> bool:
    """Permission checks on it are this kernel's: a local disk or a RAM disk."""
    return kind(fstype) in (LOCAL_DISK, RAM_DISK)


def is_ram(fstype: str) -> bool:
    """Its pages are memory (tmpfs, ramfs)."""
    return kind(fstype) == RAM_DISK


def is_local_disk(fstype: str) -> bool:
    """A disk of this host's, neither memory nor another machine's: a place for a scratch that does not fit RAM."""
    return kind(fstype) == LOCAL_DISK


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo, its escapes undone."""

    point: str
    """Where it is mounted, as this process sees its file tree."""
    fstype: str
    """The file-system type ("ext4", "tmpfs", "nfs4", "fuse.sshfs" ...)."""
    dev: int
    """Its device number, as a stat's st_dev gives it."""
    root: str = "/"
    """The directory of the file system mounted there ("/" unless a bind mount of a subdirectory)."""
    source: str = ""
    """What was mounted ("/dev/sda1", "server:/export", "tmpfs")."""
    options: str = field(default="", compare=False)
    """Its super options ("rw,vers=4.2,...,addr=10.0.0.5"): an NFS mount's name the server's address the client
    resolved its source's host to (`server_address`)."""

    def server_address(self) -> str:
        """The address of the server an NFS mount (nfs, nfs4) talks to, as the kernel shows it in the super options
        (`addr=`): the same for a share mounted by its host's name and by that host's address; "" when unknown."""
        if self.fstype not in ("nfs", "nfs4"):
            return ""
        return next((o[len("addr="):] for o in self.options.split(",") if o.startswith("addr=")), "")


_ESCAPE = re.compile(rb"\\([0-3][0-7]{2})")


def unescape(field: bytes) -> str:
    """A mountinfo field as a path string: the kernel writes space, tab, newline and backslash as \\040, \\011,
    \\012 and \\134; other bytes raw, decoded as os.fsdecode does (a name that is not UTF-8 compares equal to the
    same name from os.path.realpath)."""
    return os.fsdecode(_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), field))


def parse_line(line: bytes) -> Mount | None:
    """One mountinfo line: "ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER_OPTIONS", with
    zero or more optional fields (shared:N, master:N ...) before the lone "-". None for a line not of that form."""
    fields = line.split(b" ")
    try:
        dash = fields.index(b"-", 6)
        major, minor = (int(n) for n in fields[2].split(b":"))
        fstype = unescape(fields[dash + 1])
    except (ValueError, IndexError):
        return None
    source = unescape(fields[dash + 2]) if len(fields) > dash + 2 else ""
    options = unescape(fields[dash + 3]) if len(fields) > dash + 3 else ""
    return Mount(point=unescape(fields[4]), fstype=fstype, dev=os.makedev(major, minor), root=unescape(fields[3]),
                 source=source, options=options)


def parse(data: bytes) -> list[Mount]:
    """Every well-formed line of a mountinfo text, in its order (a later mount on one point is on top)."""
    return [m for line in data.split(b"\n") if line and (m := parse_line(line)) is not None]


def read_mounts(path: str = MOUNTINFO, max_bytes: int = MAX_MOUNTINFO_BYTES) -> list[Mount]:
    """This process's mounts; none when the file cannot be read or is over max_bytes (then no type is known)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        data = read_past_bound(fd, max_bytes)  # a /proc file's size is 0: read to its end
    except OSError:
        return []
    finally:
        os.close(fd)
    return parse(data) if len(data) <= max_bytes else []


def _holds(point: str, real_path: str) -> bool:
    return real_path == point or real_path.startswith(point.rstrip("/") + "/")


def mount_at(real_path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding `real_path` (already real: no link in it): the longest mount point that is a prefix of it,
    the last listed of several on one point (mounted over the others)."""
    best = None
    for m in mounts:
        if _holds(m.point, real_path) and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


def mount_of_dev(dev: int, mounts: list[Mount], real_path: str | None = None) -> Mount | None:
    """The mount of device `dev` (a stat's st_dev): of several (bind mounts of one file system), the one holding
    `real_path` when one is given and one does, else the first listed. None when no mount has that device (a
    btrfs subvolume's own st_dev, say)."""
    same = [m for m in mounts if m.dev == dev]
    holding = mount_at(real_path, same) if real_path is not None else None
    return holding or (same[0] if same else None)


def mount_of(path: str | os.PathLike) -> Mount | None:
    """The mount holding `path` (links followed): the one of its device that holds its real path; when its device
    is in no mount (a btrfs subvolume) or it cannot be stat'ed, the longest mount point over its real path."""
    real = os.path.realpath(path)
    mounts = read_mounts()
    try:
        dev = os.stat(real).st_dev
    except OSError:
        return mount_at(real, mounts)
    return mount_of_dev(dev, mounts, real) or mount_at(real, mounts)

