"""Who may read what a run writes: one policy for every file and directory of a run and of an export.

A run (`run.share`) and an export (`--share`) are "private" by default: directories 0700, files 0600, the owner
alone. "group" shares them read-only with the owner's group (0750, 0640), "all" with every user (0755, 0644).

The policy is applied as things are created, never by a chmod afterwards: `apply()` adds the policy's bits to the
process umask, once, at the start of `minilmd run`, `minilmd train` and `minilmd export`, before any thread and
before anything is created. Every mkdir and open() after it gets the policy's mode, in the libraries too
(TensorBoard's event files, torch.save) and in the children, which inherit the umask (the trainer). The user's
own umask is kept: it can only make things stricter (a umask 077 keeps a "group" run private). A file born 0600
whatever the umask (a mkstemp temp file, a safetensors file) is given `file_mode()`, what open() would have given,
on its descriptor before it is published. Nothing made by someone else, or before this run, is ever chmodded, and
no link is followed. Scratch itself stays 0700 whatever the policy (minilmd/scratch.py). A directory's default ACL
would take the umask's place for what is made in it: run.dir's rule refuses one that lets another user write
(`default_acl_writers`, minilmd/dir_rule.py).

Torch-free: the supervisor imports it.
"""
from __future__ import annotations

import errno
import functools
import grp
import os
import pwd
import stat
import struct
from collections.abc import Collection, Iterator, Set
from typing import NamedTuple

from minilmd import mounts, nfs4_acl
from minilmd.openflags import OPEN_FLAGS

SHARES = ("private", "group", "all")
"""The values of `run.share` and `--share`."""

MASKS = {"private": 0o077, "group": 0o027, "all": 0o022}
"""The umask bits each policy adds: 0700/0600, 0750/0640, 0755/0644 under a permissive umask."""


def own_uid() -> int:
    """The uid that owns what this process creates, and so what every "is this file ours" check compares with: its
    effective uid (Linux's file-system uid follows it; minilmd never sets that apart). Not os.getuid(): the real uid
    differs where the effective one was changed (a setuid wrapper, a service manager dropping privileges by it), and
    there a check by it would take this process's own files for another user's, and that user's for ours."""
    return os.geteuid()


def signal_uid() -> int:
    """The uid this process acts for towards other processes and their runs: its real uid. kill(2) lets a sender
    signal a process when the sender's real (or effective) uid is the target's real or saved one, so whose runs a
    command may stop, and which trainer a record names as launched by whom, go by it (minilmd/procs.py scope_of,
    the trainer record, a stop request's "by uid N"): a setuid wrapper's effective uid does not make its caller that
    user. Files are judged by own_uid, never by this."""
    return os.getuid()


def owner_in(st: os.stat_result, owners: Collection[int]) -> bool:
    """The file (as lstat or fstat saw it) is owned by one of `owners` (a run directory's owner, a registry
    entry's uid): every comparison of a file's owner outside this module goes through here or the two below."""
    return st.st_uid in owners


def owner_or_me(owner: int) -> tuple[int, ...]:
    """Whose files in a directory of someone's (`owner`: its uid, as fstat or run_dir_owner saw it) are read as that
    someone's: the directory's owner's (a run's supervisor runs as its user; a teammate's run reads as hers, root's
    view of a user's run as hers) or our own. A third user's file there is nobody's doing we trust. The one rule for
    a run's state.json, run.toml and events (daemon/base/runstate.py state_owners, minilmd/run_config_copy.py) and
    init.from's places (init_place.owners_of)."""
    return tuple(sorted({owner, own_uid()}))


def run_dir_owner(run_dir: str | os.PathLike, dir_fd: int | None = None) -> int | None:
    """The run's user: the owner of the run directory as opened. Its descriptor's when the caller holds one
    (`dir_fd`: the directory judged, never what its name leads to now); else that of the directory `run_dir` opens
    (O_PATH: no read right needed, a teammate's private run directory has an owner too), a link on the way followed
    as every read of the run by that path follows it, so a link's own owner is never taken for the run's. None when
    it cannot be looked at (gone, no search right on the way, not a directory). The one rule of every reader that
    asks whose a run is by its directory: whose run lock (daemon/base/seen.py), state.json and events
    (daemon/base/runstate.py state_owners), stop request (daemon/base/stoprequest.py) and scratch
    (checkpoint_select.run_roots) are the run's."""
    try:
        if dir_fd is not None:
            return os.fstat(dir_fd).st_uid
        fd = os.open(run_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return os.fstat(fd).st_uid
        finally:
            os.close(fd)
    except OSError:
        return None


def owned_by_me(st: os.stat_result, also: Collection[int] = ()) -> bool:
    """The file (as lstat or fstat saw it) is this process's user's: the one owner rule of "is this ours". `also`:
    more uids counted as ours (a squashing share's LearntOwners, the root's owner of a checkpoint root)."""
    return st.st_uid == own_uid() or st.st_uid in also


def owned_by_me_or_root(st: os.stat_result, also: Collection[int] = ()) -> bool:
    """The file is this user's or root's (or one of `also`, as owned_by_me): the owners a directory on the way to
    ours may have (root's /tmp, /dev/shm, /var/lock), since its owner alone can remove or swap what is in it,
    sticky or not."""
    return root_owned(st) or owned_by_me(st, also)


def root_owned(st: os.stat_result) -> bool:
    """The file is root's (a mount point made by root, a directory on the way any user may trust)."""
    return st.st_uid == 0


def is_own_uid(uid: int | None) -> bool:
    """A uid already read from a file (a count's key, a message's owner) is this process's user's: for the words
    ("yours" or whose). A decision about a file asks owner_in / owned_by_me on its stat, not this."""
    return uid == own_uid()


class LearntOwners(Set[int]):
    """The uids this process's own entries show in a place that may map them (a run.remote on NFS: root_squash gives
    root's files the anonymous user, all_squash everyone's): own_uid(), asked at every look (never a copy taken
    once: a uid frozen at import stayed "ours" when own_uid said otherwise), and each uid `learn`t from a file
    this process made there. A Set: `uid in owners`, place_rule's and Dir's `owners`, untrusted's `owner`."""

    def __init__(self, *learnt: int):
        self._learnt = set(learnt)

    def __contains__(self, uid: object) -> bool:
        return uid == own_uid() or uid in self._learnt

    def __iter__(self) -> Iterator[int]:
        return iter({own_uid(), *self._learnt})

    def __len__(self) -> int:
        return len({own_uid(), *self._learnt})

    def __repr__(self) -> str:
        return f"LearntOwners(own {own_uid()}, learnt {sorted(self._learnt)})"

    def learn(self, uid: int) -> bool:
        """Count `uid` as this process's from now on: whether it was not already."""
        if uid in self:
            return False
        self._learnt.add(uid)
        return True


@functools.lru_cache(maxsize=1)
def squash_uids() -> frozenset[int]:
    """The uids that show a file's owner as unknown, never as who wrote it: the one an NFS share squashes to
    (all_squash: every user's files; root_squash: root's), nobody's and nfsnobody's, and the kernel's overflow uid
    (/proc/sys/fs/overflowuid: what a user namespace shows for an owner it does not map, on any file system).
    Cached: these do not change while a command runs. The one list: source_owner's claims and remote_write's
    learning of a squashing share's owner both ask it."""
    found = {65534, 4294967294}  # anonuid's default; 4294967294 on old kernels
    for name in ("nobody", "nfsnobody"):  # the users NFS maps squashed uids to
        try:
            found.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            pass
    try:
        with open("/proc/sys/fs/overflowuid", encoding="ascii") as f:
            found.add(int(f.read(32).strip()))
    except (OSError, ValueError):
        pass
    return frozenset(found)


def user_words(uid: int | None) -> str:
    """A uid for a message: "user alice (uid 1000)", "uid 1234" (no such user), "an unknown user" (None). The one
    place a uid is named."""
    if uid is None:
        return "an unknown user"
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def own_link(st: os.stat_result) -> bool:
    """`st` (an lstat) is a symbolic link of this user's or root's: the one kind minilmd follows to a directory it
    opens (minilmd/dirfd.py Dir.open, Dir.at's own_links); one planted by another user, in /tmp say, is refused."""
    return stat.S_ISLNK(st.st_mode) and owned_by_me_or_root(st)


def others_can_write(st: os.stat_result, where: str | os.PathLike | int | None = None, *,
                     team: bool = False, reading: bool = False) -> bool:
    """Another user can write to this directory (add an entry: a kernel to a compile cache, a name to a scratch) or
    this file: others may write to it, or its group, which counts as others (`_group_is_others`) but for a group
    whose only member is this user (`private_group`: the user private groups of Debian and Ubuntu, whose umask 002
    makes every new directory 0775); that is trusted only on a local file system (`local_fs`: on NFS with AUTH_SYS
    the server believes the gids any client sends, so a user of another node in that gid there writes too) and
    when `where` (the directory's path as `st` saw it, or a descriptor of it) shows no ACL, which could let a named
    user write behind the group bits. A sticky bit does not help here: it keeps others from removing or renaming
    entries, not from adding them (others_can_rearrange). `team`: a team directory the owner opted in to
    (group-writable): only a world-writable one counts. `reading`: a directory only read from (the one holding a
    run config), where a directory of this user's in her user private group by its name (`named_private_group`)
    is hers even when private_group cannot prove it. The one rule of "may another user write here": the audit
    (tests/test_mode_bits_audit.py) lists a write or sticky bit of a mode tested anywhere else."""
    if st.st_mode & stat.S_IWOTH:
        return True
    if not st.st_mode & stat.S_IWGRP or team:
        return False
    if reading and where is not None and named_private_group(st) and not has_acl(where):
        return False
    return _group_is_others(st, where)


def others_can_rearrange(st: os.stat_result, where: str | os.PathLike | int | None = None, *,
                         team: bool = False, reading: bool = False) -> bool:
    """Another user can create, rename or remove entries in this directory: others_can_write (`reading` as there),
    unless it is sticky with an owner in owned_by_me_or_root (sticky: only an entry's owner, the directory's and
    root may remove or rename it)."""
    if st.st_mode & stat.S_ISVTX and owned_by_me_or_root(st):
        return False
    return others_can_write(st, where, team=team, reading=reading)


def _group_is_others(st: os.stat_result, where: str | os.PathLike | int | None) -> bool:
    """The group of `st` counts as other users (others_can_write's rule): it is not this user's alone, or that
    cannot be trusted (not a local file system, an ACL at `where`, no `where` to look at)."""
    return where is None or not private_group(st.st_gid) or not local_fs(st.st_dev) or has_acl(where)


def who_else_writes(st: os.stat_result, where: str | os.PathLike | int | None = None) -> str | None:
    """Who besides this user and root can change the file `st` describes (lstat or fstat), in words, or None: its
    owner, when another user (he can chmod it at will); every user, or its group, when its mode lets them (a group
    counts as others by others_can_write's rule; `where`, the file's path or a descriptor of it, for its ACL).
    The one judgement of "may another user have changed this file" (a corpus's files, for `prepare --append` and
    staging)."""
    mode = stat.S_IMODE(st.st_mode)
    if not owned_by_me_or_root(st):
        return f"owned by {user_words(st.st_uid)}, mode {mode:o}"
    if not others_can_write(st, where):
        return None
    if st.st_mode & stat.S_IWOTH:
        return f"writable by every user, mode {mode:o}"
    return f"writable by its {group_words(st.st_gid)}, mode {mode:o}"


def group_words(gid: int) -> str:
    """A gid for a message: "group team (gid 1001)", "gid 1234" (no such group)."""
    try:
        return f"group {grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def local_fs(dev: int) -> bool:
    """The file system of device `dev` (a stat's st_dev) is local (minilmd/mounts.py `is_local`: a local or RAM
    disk, by /proc/self/mountinfo); a network or FUSE one, an unknown type, or one not found there, is not."""
    found = mounts.mount_of_dev(dev, mounts.read_mounts())
    return found is not None and mounts.is_local(found.fstype)


def private_group(gid: int) -> bool:
    """The group `gid` is this user's alone: this user is in it (as primary group or listed) and no other user is:
    none lists it as primary group (the passwd database, enumerated), none is listed in it (gr_mem of every group
    entry with that gid: getgrgid shows only the first of duplicates). Where the
    passwd database cannot be enumerated (LDAP or sssd without enumeration: this user is not in the list), the
    group counts as shared. Decided once per group and process (`_private_to`); enumerated only for a group of
    this user's that lists no one else."""
    return _private_to(own_uid(), gid)


def named_private_group(st: os.stat_result) -> bool:
    """The directory `st` describes is this user's and its group is her user private group by the convention that
    makes one (useradd's USERGROUPS_ENAB, the default of Debian, Ubuntu, Fedora and RHEL; sssd and LDAP sites alike):
    her primary group, named as she is, listing no one else. Where the passwd database cannot be enumerated,
    private_group cannot rule out another user with that primary group, so such a group counts as shared; yet under
    umask 002 every directory she makes is 0775 in it, and refusing her own ~/configs (review11b F2) turned a
    systemd restart after an upgrade into a final exit 2. Trusted for reading a run config only (others_can_write's
    `reading`), never for a place minilmd writes: another user given that gid as primary would be an administrator's
    doing against the convention, and what he could do is make her run a config she can read and check first."""
    if not owned_by_me(st):
        return False
    try:
        me = pwd.getpwuid(own_uid())
        group = grp.getgrgid(st.st_gid)
    except KeyError:
        return False
    return me.pw_gid == st.st_gid and group.gr_name == me.pw_name and not set(group.gr_mem) - {me.pw_name}


@functools.lru_cache(maxsize=64)
def _private_to(uid: int, gid: int) -> bool:
    try:
        me = pwd.getpwuid(uid)
        entries = [entry for entry in grp.getgrall() if entry.gr_gid == gid] or [grp.getgrgid(gid)]
    except KeyError:
        return False  # a user or group the databases do not know: its members cannot be told
    listed = {name for entry in entries for name in entry.gr_mem}
    if listed - {me.pw_name} or (me.pw_gid != gid and me.pw_name not in listed):
        return False
    everyone = pwd.getpwall()
    if not any(entry.pw_uid == uid for entry in everyone):
        return False  # no enumeration (or a partial one): another user's primary group cannot be ruled out
    return not any(entry.pw_gid == gid and entry.pw_uid != uid for entry in everyone)


ACL_XATTRS = ("system.posix_acl_access", "system.nfs4_acl")


def has_acl(where: str | os.PathLike | int) -> bool:
    """`where` (not followed if a link; or a descriptor, O_PATH ones too, looked at through /proc/self/fd) carries a
    POSIX or NFSv4 access ACL; one that cannot be looked at counts as carrying one. A file system without ACLs
    (ENOTSUP) has none."""
    follow = isinstance(where, int)
    path = f"/proc/self/fd/{where}" if follow else where
    for name in ACL_XATTRS:
        try:
            os.getxattr(path, name, follow_symlinks=follow)
        except OSError as e:
            if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
                continue
            return True
        return True
    return False


DEFAULT_ACL_XATTR = "system.posix_acl_default"
"""A directory's default POSIX ACL: what every file and directory made in it gets in place of the umask (and every
directory made in it as its own default ACL). `setfacl -d -m o::rwx DIR` makes a file opened 0666 there writable by
every user, whatever run.share's umask says; `setfacl -d -m u:bob:rwx DIR`, by bob."""

_ACL_ENTRY = struct.Struct("<HHI")
"""One entry of a POSIX ACL xattr (the kernel's posix_acl_xattr_entry): tag, permissions, uid or gid."""
_ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP, _ACL_MASK, _ACL_OTHER, _ACL_WRITE = 0x02, 0x04, 0x08, 0x10, 0x20, 0o2


class AclWriters(NamedTuple):
    """default_acl_writers' finding: `who` in words ("user bob (uid 1001), every user"); `named`, when every one of
    them is a named entry, those entries as `setfacl -x` takes them ("d:u:1001", "d:g:4242"): removing them alone
    lets no one else write, the rest of the default ACL kept."""

    who: str
    named: tuple[str, ...] = ()
    nfs4: bool = False
    """Found in an NFSv4 ACL (minilmd/nfs4_acl.py): nfs4_setfacl's to change, not setfacl's."""


def default_acl_writers(st: os.stat_result, where: str | os.PathLike | int) -> AclWriters | None:
    """Who besides this user and root may write what is made in the directory `st` describes (`where`: its path, a
    link not followed, or a descriptor, O_PATH ones too), by its default POSIX ACL (AclWriters: in words, and the
    named entries to remove); None where it has none (a file system without ACLs has none) or one that lets no one
    else write.
    Others: a named user but this one and root; a group, the owning one (that of what is made: the directory's when
    it is setgid, else this process's) or a named one, unless it is this user's alone on a local file system
    (others_can_write's rule); other; each as its write bit after the mask. One that cannot be read or is not one
    this reader knows counts as letting someone write."""
    follow = isinstance(where, int)
    path: str | os.PathLike = f"/proc/self/fd/{where}" if isinstance(where, int) else where
    try:
        raw = os.getxattr(path, DEFAULT_ACL_XATTR, follow_symlinks=follow)  # the kernel bounds it: 64 KiB
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return _nfs4_writers(st, path, follow)  # an NFSv4 mount has no POSIX default ACL, but its own
        return AclWriters(f"whoever its default ACL names (it cannot be read: {e.strerror or e})")
    if raw[:4] != struct.pack("<I", 2) or (len(raw) - 4) % _ACL_ENTRY.size:
        return AclWriters("whoever its default ACL names (not an ACL this reader knows)")
    entries = list(_ACL_ENTRY.iter_unpack(raw[4:]))
    mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 0o7)
    made_gid = st.st_gid if st.st_mode & stat.S_ISGID else os.getegid()
    who, named, unnamed = [], [], False
    for tag, perm, qualifier in entries:
        if not perm & (mask if tag in (_ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP) else 0o7) & _ACL_WRITE:
            continue
        if tag == _ACL_USER and qualifier not in (own_uid(), 0):
            who.append(user_words(qualifier))
            named.append(f"d:u:{qualifier}")
        elif tag in (_ACL_GROUP_OBJ, _ACL_GROUP):
            gid = made_gid if tag == _ACL_GROUP_OBJ else qualifier
            if not (private_group(gid) and local_fs(st.st_dev)):
                who.append(f"the members of {group_words(gid)}")
                if tag == _ACL_GROUP:
                    named.append(f"d:g:{gid}")
                else:  # the owning group's entry: setfacl -x cannot remove it
                    unnamed = True
        elif tag == _ACL_OTHER:
            who.append("every user")
            unnamed = True
    return AclWriters(", ".join(who), () if unnamed else tuple(named)) if who else None


def _nfs4_writers(st: os.stat_result, path: str | os.PathLike, follow: bool) -> AclWriters | None:
    """default_acl_writers' reading of an NFSv4 ACL (`system.nfs4_acl`, where the NFSv4 client shows one): its
    inheritable entries letting others write (minilmd/nfs4_acl.py), None where there is none (no NFSv4 ACL, or
    none that passes write on). One that cannot be read or parsed counts as letting someone write."""
    try:
        raw = os.getxattr(path, nfs4_acl.XATTR, follow_symlinks=follow)  # the kernel bounds it: 64 KiB
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return None
        return AclWriters(f"whoever its NFSv4 ACL names (it cannot be read: {e.strerror or e})", nfs4=True)
    made_gid = st.st_gid if st.st_mode & stat.S_ISGID else os.getegid()
    try:
        who = nfs4_acl.inheritable_writers(raw, _is_me, group_words(made_gid))
    except nfs4_acl.Unknown as e:
        return AclWriters(f"whoever its NFSv4 ACL names (not an ACL this reader knows: {e})", nfs4=True)
    return AclWriters(", ".join(who), nfs4=True) if who else None


def _is_me(who: str) -> bool:
    """An NFSv4 ACL's `who` (name, name@domain or a number) naming this user or root."""
    uid = own_uid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = None
    bare = who.partition("@")[0]
    return bare in {str(uid), "0", "root"} or (name is not None and bare == name)


def problem(share: object, key: str = "run.share") -> str | None:
    """The config error for a value that is not a policy, None for a good one."""
    if share in SHARES:
        return None
    return f"{key} = {share!r}: must be \"private\", \"group\" or \"all\" (who may read what the run writes)"


def current_umask() -> int:
    """The process umask, read without changing it (Linux's /proc/self/status); elsewhere swapped with 0o777 and
    back, never through a value looser than it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o777)
    os.umask(old)
    return old


def apply(share: str) -> int:
    """Make everything this process (and its children) creates from now on follow `share`; returns the umask set.
    Only ever adds bits to the umask: never looser than the user's own. Call it before starting any thread."""
    if share not in MASKS:
        raise ValueError(problem(share))
    mask = current_umask() | MASKS[share]
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a file created now should have: what open() gives under the process umask, which carries the
    policy (apply() here, or inherited from the supervisor)."""
    return 0o666 & ~current_umask()


PUBLISHED_FILE_MODE = 0o644
"""A file others read and only its owner writes: a prepared corpus's, a trained tokenizer's. umask 002 (Debian's and
Ubuntu's default) made them 0664: in a setgid team directory a teammate edited the victim's tokens.bin (hostile audit
6 F2), or her tokenizer.json (every corpus prepared with it after would encode with his vocabulary)."""


def published_file_mode() -> int:
    """PUBLISHED_FILE_MODE less the umask (a narrower one narrows it: 027 gives 0640), whatever else the umask lets
    others do: no one but the owner ever writes such a file. `prepare` gives it to every file of a corpus, `tokenizer
    train` and `tokenizer template` to what they write."""
    return PUBLISHED_FILE_MODE & ~current_umask()


def settle_new_file(path: str | os.PathLike) -> None:
    """Give a file this process has just written, in a directory it has just made (a safetensors file, born 0600
    whatever the umask), the policy's file mode: through a descriptor opened without following a link, and only a
    regular file that is ours."""
    fd = os.open(path, OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and owned_by_me(st) and stat.S_IMODE(st.st_mode) != file_mode():
            os.fchmod(fd, file_mode())
    finally:
        os.close(fd)
