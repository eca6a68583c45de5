"""Which directory a run's local remote is: the root its syncs wrote to, known by what a path cannot carry.

A share mounted by hand on a directory no fstab, autofs map or systemd unit names (minilmd/mount_places.py knows
only those) and unmounted while the run trains leaves its mount point, an empty directory of the local disk. The
next sync made `remote/` again in it, claimed it, synced there "verified", and the run ended `done`, exit 0, scratch
given back, while the share held an older step (fault audit 10, F1). A directory moved away and another put at its
path was taken alike. So the run records what its remote's root is when it claims it (`remember`: device, inode, the
file system's type, source and mount point from /proc/self/mountinfo), in its own record in run.dir (remote_made.py
`Made.root`, `remote-made.json`: the user's file, which a reboot leaves), and once the run's records say it synced
there (Claim.synced_before: state.json's remote step, events.jsonl's syncs since the last `--fresh`):
- a root that is not there is never made again (`judge_missing`). The sync fails, "remote unavailable: run.remote R
  is gone (it was ...; an unmounted share?)", and is retried: training goes on, the last sync waits, no try counted
  (sync_errors.RemoteGone), and the run never ends done without it;
- a root that is there but is another directory than the record's (`judge_opened`: another device and not the same
  share mounted again, or another inode) is refused alike, saying which: nothing is written or deleted there.
A run whose records say it never synced there (a first sync cut, a `--fresh` lineage) makes the root or takes the
one there, and records it, but only on the file system the record names (type, source, mount point; or a record
that knows none): after `run --fresh`, an unmounted share's empty mount point of the local disk is refused alike
(review 12c F5: before, remote/ was made there).
The record is written at the claim, before the first copy, so it is the check before any sync completed as well: a
root whose recorded mount is mounted nowhere now (`_unmounted`: a share unmounted after the first sync claimed it,
its copy failed or cut; the remote its mount point or below it) is gone, said so, whatever the run's records say
(before, with the remote the mount point itself, "not the directory this run synced to"). A run with nothing
recorded (brand new) makes its root where its path leads, as before: nothing tells a mount point from a directory.
`minilmd run --check` says a root gone or replaced before the start (`check_words`: the same rule and words, read
only; daemon/preflight.py remote_root_wait).
The same share mounted again (a reboot, an automounter's expiry) has the same file-system type (nfs and nfs4 alike),
source and root inode, maybe another device number: it is the same root, and the record takes its device. An NFS
share mounted again by its server's address instead of its name (`10.0.0.5:/export` for `nfs.example:/export`), or
the other way round, is the same source when the export path and the server address the kernel shows for the mount
(`addr=` in mountinfo's super options, recorded as `server`) are alike. statvfs's f_fsid is no test of it: Linux's
NFS client has long left it 0 (FUSE too), and zeros alike say nothing. A FUSE
share (fuse.*: rclone, sshfs, gcsfuse) numbers its inodes anew at each mount: its root is known by type, source
and its path under the mount point (`under`), its inode not compared. A device no mount lists (a btrfs
subvolume's) is recorded with the mount holding the root's path (review 12c F4: before, with no type nor source,
so that a device number changed at a reboot was refused).
A record for another run.remote is no record of this one (a config that names another remote: the first sync
there records it). The user who put another directory at that path on purpose says so with `minilmd run
--claim-remote CONFIG` (`accept`, called by remote_consent.take_over_at_launch): the next sync records the root it
finds, or makes it where it is not there. Torch-free.
"""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from minilmd import mounts, urls
from minilmd.daemon.jobs import remote_made
from minilmd.dirfd import Dir


class NotTheRoot(OSError):
    """run.remote's root is gone or is not the directory this run synced to: nothing is made, written or deleted
    there. Said in its words alone (no errno)."""

    def __str__(self) -> str:
        return str(self.strerror)


@dataclass(frozen=True)
class RootRecord:
    """What a local remote's root was when the run claimed it."""

    url: str
    dev: int = 0
    ino: int = 0
    fstype: str = ""
    source: str = ""
    point: str = ""
    under: str = ""
    """The root's path below the mount point ("remote", "." for the mount point itself): a FUSE share's root is
    known by it, its inode numbers new at each mount."""
    server: str = ""
    """An NFS share's server address as its mount showed it (`addr=`): the same share mounted again by that address
    instead of its host's name (or the other way round) is told by it (`_same_source`)."""
    accept: bool = False
    """`run --claim-remote` was given: the next sync records the root as it finds it (no identity yet)."""

    def words(self) -> str:
        """"dev 0:43 inode 2 on fuse faultfs mounted at /mnt/x"."""
        on = f" on {self.fstype}" + (f" {self.source}" if self.source else "") if self.fstype else ""
        at = f" mounted at {self.point}" if self.point else ""
        return f"dev {os.major(self.dev)}:{os.minor(self.dev)} inode {self.ino}{on}{at}"

    def same_share(self, now: RootRecord) -> bool:
        """Whether `now` is this root: the same device and inode, or the same share mounted again (its file-system
        family and source known and alike; another device number after a remount). A FUSE share (fuse.*: rclone,
        sshfs, gcsfuse) numbers its inodes anew at each mount: its root is the same path under its mount point."""
        if now.ino == self.ino and now.dev == self.dev:
            return True
        share = bool(self.fstype and self.source and _family(now.fstype) == _family(self.fstype)
                     and _same_source(self, now.source, now.server))
        if self.fstype.startswith("fuse.") and self.under:  # a record without it (older) compares inodes
            return share and now.under == self.under
        return share and now.ino == self.ino

    def same_file_system(self, fstype: str, point: str, source: str, server: str) -> bool:
        """Whether the mount that holds the root's path now (`fstype` mounted at `point` from `source`, NFS `server`
        address; all "" where none is known) is the one the record names (type family, source and mount point), or
        the record knows none: a `--fresh` lineage may make or take the root there, never on the local disk under
        an unmounted share's mount point."""
        if not (self.fstype or self.point):
            return True
        return bool(point) and (_family(fstype), point) == (_family(self.fstype), self.point) and \
            _same_source(self, source, server)


def _same_source(found: RootRecord, source: str, server: str) -> bool:
    """Whether a mount's `source` (and NFS `server` address) names the share the record does: the same source, or,
    for NFS, the same export path on the same server address (`nfs.example:/export` mounted again as
    `10.0.0.5:/export`: the kernel resolved the name to that address, and shows it, for both). A record without an
    address (older, or not NFS) needs the same source."""
    if source == found.source:
        return True
    return bool(found.server) and server == found.server and _export(source) == _export(found.source) != ""


def _export(source: str) -> str:
    """The export path of an NFS source ("host:/export", "[fe80::1]:/export"); "" for another shape."""
    path = source.rpartition(":")[2]
    return path if path.startswith("/") else ""


def _family(fstype: str) -> str:
    """One name for the types one share may be mounted again as (nfs and nfs4)."""
    return "nfs" if fstype in ("nfs", "nfs4") else fstype


def of(url: str, held: Dir, every: list[mounts.Mount] | None = None) -> RootRecord:
    """What the root opened as `held` is: its device and inode, and the mount of its device, or the mount holding its
    path when no mount has its device (a btrfs subvolume's), with the root's path under that mount point. `every`:
    the mounts as read once for this look (read now when None)."""
    return _of(url, os.fstat(held.fd), os.path.realpath(held.path), every)


def _of(url: str, st: os.stat_result, real: str, every: list[mounts.Mount] | None = None) -> RootRecord:
    every = mounts.read_mounts() if every is None else every
    found = mounts.mount_of_dev(st.st_dev, every, real) or mounts.mount_at(real, every)
    if found is None:
        return RootRecord(url, st.st_dev, st.st_ino)
    return RootRecord(url, st.st_dev, st.st_ino, found.fstype, found.source, found.point,
                      under=os.path.relpath(real, found.point), server=found.server_address())


def _mount_now(url: str) -> mounts.Mount | None:
    """The mount that holds `url`'s path now (its nearest directory there, the root being gone)."""
    path = urls.local_remote_root(url) or url
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return mounts.mount_of(path)


def recorded(url: str, made: remote_made.Made) -> RootRecord | None:
    """The record of `url`'s root (None: none, or one of another run.remote, or not of the shape written)."""
    raw = made.root()
    if not raw or raw.get("url") != url:
        return None
    try:
        found = RootRecord(**{k: raw[k] for k in RootRecord.__dataclass_fields__ if k in raw})
    except TypeError:
        return None
    kinds = [isinstance(getattr(found, k), int) for k in ("dev", "ino")] + \
        [isinstance(getattr(found, k), str) for k in ("fstype", "source", "point", "under", "server")]
    return found if all(kinds) else None


def replaced_words(url: str, made: remote_made.Made, now: tuple[int, int] | None) -> str:
    """What the recorded root was, with the inode of what stands at its path now (`now`: device, inode), when that is
    not the same root by `same_share`; "" when it is (a FUSE share's new inode numbers are no replacement), or nothing
    was recorded, or nothing stands there. For the words beside a place-rule refusal, which comes before
    judge_opened's look (remote_claim.replaced): one rule of what "the same root" is."""
    found = recorded(url, made)
    if found is None or found.accept or now is None or found.same_share(replace(found, dev=now[0], ino=now[1])):
        return ""
    return f"was {found.words()}; inode {now[1]} now"


def judge_missing(url: str, made: remote_made.Made, synced_before: Callable[[], str]) -> None:
    """Before the sync makes the root that is not there: NotTheRoot when the run's records say it synced there
    (`synced_before`: since the last `--fresh`), unless `run --claim-remote` was given since; the record says what
    the root was."""
    found = recorded(url, made)
    if found is not None and found.accept:
        return
    if not (why := synced_before()):
        now = _mount_now(url)
        if found is None or (now is not None and found.same_file_system(now.fstype, now.point, now.source,
                                                                        now.server_address())):
            return  # a run that never synced there (a `--fresh` lineage) makes it, where the record's file system is
        why = f"its path is now on {_mount_words(now.fstype, now.source, now.point) if now else 'no mount known'}"
    raise _gone(url, found, why)


def _gone(url: str, found: RootRecord | None, why: str) -> NotTheRoot:
    """The words of a root gone: what the record says it was (`found`), and `why` it is taken for gone."""
    was = f"it was {found.words()}; {why}" if found is not None else why
    return NotTheRoot(errno.ENOENT, f"run.remote {url} is gone ({was}; an unmounted share?): the run's copies are "
                                    f"there, not here, so it is not made again on whatever disk holds its path now; "
                                    f"mount the share again (the syncs go on by themselves), or, to sync to a new "
                                    f"empty {url} from now on, start the run once with `minilmd run --claim-remote "
                                    f"CONFIG`, or set run.remote to another place")


def judge_opened(url: str, held: Dir, made: remote_made.Made, synced_before: Callable[[], str]) -> None:
    """The root just opened (`held`) against the record: NotTheRoot when it is another directory than the one the
    run synced to and its records say it synced there, or when the mount the record names is mounted nowhere now
    (`_unmounted`: gone, whether the run synced there or only claimed it); the same share mounted again under another
    device number, or another root where the run's records say it never synced (a `--fresh` lineage's), is recorded
    so."""
    found = recorded(url, made)
    if found is None or found.accept:
        return
    every = mounts.read_mounts()
    if (keep := _judged(url, found, of(url, held, every), synced_before, every)) is not None:
        made.set_root(asdict(keep))


def _judged(url: str, found: RootRecord, now: RootRecord, synced_before: Callable[[], str],
            every: list[mounts.Mount]) -> RootRecord | None:
    """judge_opened's rule, recording nothing: NotTheRoot, or the record to keep from now on (None: as it is)."""
    if now.dev == found.dev and now.ino == found.ino:
        return None
    if found.same_share(now):
        return now
    if _unmounted(found, every):  # its mount point a directory of whatever holds it: no other share, nor replaced
        there = _mount_words(now.fstype, now.source, now.point) if now.point else "no mount known"
        raise _gone(url, found, f"its path is now on {there}")
    elsewhere = not found.same_file_system(now.fstype, now.point, now.source, now.server)
    if not synced_before() and not elsewhere:
        return now
    which = "another device: a share unmounted, its mount point's directory of the local disk in its place" \
        if now.dev != found.dev or elsewhere else "another directory of the same file system: the one synced to " \
                                                  "moved away"
    raise NotTheRoot(errno.ESTALE, f"run.remote {url} is not the directory this run synced to (was {found.words()}, "
                                   f"now {now.words()}: {which}, or the directory replaced): nothing is written or "
                                   f"deleted there; mount the share again, or put the directory back (the syncs go "
                                   f"on by themselves); if it was replaced on purpose (this run's checkpoints moved "
                                   f"there), start the run once with `minilmd run --claim-remote CONFIG`, which "
                                   f"takes the directory there now as this run's remote")


def _unmounted(found: RootRecord, every: list[mounts.Mount]) -> bool:
    """Whether the mount the record names (a share's, the root its mount point or below it) is mounted nowhere now:
    its point is in no line of a mount table that could be read. The record is written when the run claims the root,
    before its first copy: a share unmounted before any sync of the run completed is gone too (before, only once the
    run's records said it synced there)."""
    return bool(found.point and found.fstype and every) and all(m.point != found.point for m in every)


def check_words(url: str, made: remote_made.Made, synced_before: Callable[[], str]) -> str:
    """What the next sync would refuse run.remote's root for, for `run --check` (daemon/preflight.py) to say before
    the start: judge_missing's words for a root not there, judge_opened's rule (`_judged`) for the directory there
    now; "" when nothing. The same rules and words, read only: nothing made, opened for writing nor recorded (the
    same share mounted again under another device number is the sync's to record). A root whose path cannot be
    looked at (EIO, ESTALE), or that the place rule of path_checks.remote_parents_refused already refuses (said by
    its own check), is left to those words."""
    from minilmd.path_checks import remote_parents_refused

    path = urls.local_remote_root(url) or url
    found = recorded(url, made)
    if found is not None and found.accept or remote_parents_refused(path):
        return ""
    try:
        st: os.stat_result | None = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as e:
        if e.errno != errno.ELOOP:
            return ""
        st = None
    try:
        if st is None:
            judge_missing(url, made, synced_before)
        elif stat.S_ISDIR(st.st_mode) and found is not None:
            every = mounts.read_mounts()
            _judged(url, found, _of(url, st, os.path.realpath(path), every), synced_before, every)
    except NotTheRoot as e:
        return str(e)
    return ""


def _mount_words(fstype: str, source: str, point: str) -> str:
    return f"{fstype} {source} mounted at {point}"


def remember(url: str, held: Dir, made: remote_made.Made) -> None:
    """Once the root is claimed (or this run's already): its identity recorded when the record has none of it."""
    found = recorded(url, made)
    if found is None or found.accept:
        made.set_root(asdict(of(url, held)))


def accept(url: str, run_dir: Path) -> None:
    """`run --claim-remote`: whatever the next sync finds at `url` (or makes there) is this run's remote."""
    remote_made.Made(remote_made.run_record(run_dir)).set_root(asdict(RootRecord(url, accept=True)))
