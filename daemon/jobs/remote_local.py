"""A run's remote on a local path (NFS included): RemoteStore's local half (daemon/jobs/remote.py's Remote is the
fsspec one, and `open_remote` chooses by URL). It is a place other users and machines may write: its small files are
read as untrusted (minilmd/untrusted.py), no link followed from the root down (one placed there may point at another
user's file, /dev/zero or a FIFO), and a listed file that is not a regular file or lies past a link (a FIFO would
block a hash, /dev/zero never end one) is a problem of its checkpoint before anything of it is read. What a sync
writes there is made new, never through a link (daemon/jobs/remote_write.py), and every write, rename and removal
starts at the descriptor of the root opened once and checked by dirfd's rule (`_root`; renames into place:
daemon/jobs/remote_publish.py). Only this user's real directories count as the run's steps, are removed or set
aside. Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from minilmd import fsio, mounts, perms
from minilmd.daemon.jobs import remote_made, remote_root, remote_write
from minilmd.daemon.jobs.remote import CHUNK, Remote
from minilmd.daemon.jobs.remote_publish import Publishing
from minilmd.daemon.jobs.remote_store import Steps
from minilmd.dirfd import Dir
from minilmd.names import LATEST
from minilmd.path_checks import remote_parents_refused
from minilmd.place_rule import walk_to
from minilmd.tmpnames import fresh_tmp_name
from minilmd.untrusted import (
    MAX_DIR_ENTRIES,
    TooManyEntries,
    Unreadable,
    file_kind,
    listed,
    open_regular,
    printable,
    read_bytes,
)
from minilmd.urls import open_fs


def _nearest_there(root: str) -> str:
    """`root`, or the nearest entry on the way to it that is there (no link followed to find it)."""
    path = os.path.normpath(root)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


class RootCrowded(TooManyEntries):
    """A local remote's root of more entries than a sync lists: said in its words alone (no errno, no repr)."""

    def __str__(self) -> str:
        return str(self.strerror)


def _answers(held: Dir) -> bool:
    """Whether a descriptor still answers (an NFS share remounted leaves it stale: ESTALE)."""
    try:
        os.fstat(held.fd)
    except OSError:
        return False
    return True


FLUSH_EVERY_BYTES = 64 << 20
"""A copy to a local remote is flushed to it this often: an NFS client takes gigabytes into its page cache at once,
and the final fsync would then send them all with no progress to show (a slow remote taken for a stalled one)."""


class LocalRemote(Publishing, Remote):
    """A local path's remote: reads as untrusted, writes at the root's checked descriptor, renames into place."""

    def __init__(self, url: str, tmp_tag: str = "", opened=None):
        super().__init__(url, tmp_tag, opened)
        self._dir: Dir | None = None
        self._stale: list[Dir] = []
        self._opening = threading.Lock()
        self.made = remote_made.Made()
        """What this run's syncs made here and may remove (remote_made.py): the Syncer gives it the run's record."""
        self.synced_before: Callable[[], str] = lambda: ""
        """Why the run's records say it synced here ("": they do not): a root gone is not made again then."""

    @property
    def renames_into_place(self) -> bool:
        """A local path (NFS included) has atomic rename and fsync."""
        return True

    # --- the root's descriptor -------------------------------------------------------------------------------------
    def _root(self) -> Dir:
        """The local remote's root as opened and checked by dirfd's rule (remote_write.open_root: no link on the way but
        one of root's or this user's, no directory above it that another user could rearrange; the root itself may be a
        team directory others write, never another user's): every write, rename and removal starts at this descriptor,
        so a link swapped in afterwards for the root or a directory above it redirects none. Opened when none is held or
        the one held has gone stale (ESTALE); checked again at each sync's start (`makedirs()`). PlaceRefused (a
        ValueError) when the rule refuses it, an OSError when it is not there."""
        with self._opening:
            if self._dir is not None and _answers(self._dir):
                return self._dir
        return self._reopen()

    def _reopen(self) -> Dir:
        """The root opened and checked again; the descriptor held is kept while it is still the directory the root's
        path leads to, else replaced (the root made again, a share remounted). A replaced one, which another thread
        may still use, is closed at the next sync's start (`makedirs()`) or with the Remote. NotTheRoot when it is
        not the directory the run claimed (remote_root.judge_opened: a share unmounted, the directory replaced)."""
        fresh = remote_write.open_root(self.root)
        try:
            remote_root.judge_opened(self.url, fresh, self.made, self.synced_before)
        except BaseException:
            fresh.close()
            raise
        with self._opening:
            held = self._dir
            if held is not None and held.identity == fresh.identity and _answers(held):
                fresh.close()
                return held
            if held is not None:
                self._stale.append(held)
            self._dir = fresh
            return fresh

    def root_identity(self) -> remote_made.Identity:
        """(device, inode) of the root as opened and checked (`_root`)."""
        return self._root().identity

    def dead_mount(self) -> str:
        """Words for a root whose mount answers no access until it is mounted again (mounts.DEAD_MOUNT_ERRNOS: a FUSE
        daemon gone, a stale NFS handle), as its stat answers now; "" when it answers, or fails otherwise."""
        try:
            os.stat(self.root)
        except OSError as e:
            if what := mounts.DEAD_MOUNT_ERRNOS.get(e.errno or 0):
                return f"run.remote {self.url}: {what} ({e.strerror}): mount it again"
        return ""

    def root_identity_now(self) -> remote_made.Identity | None:
        """(device, inode) of what stands at the root's path now, whatever the place rule says of it (words only:
        remote_claim.replaced); None when nothing is there or it cannot be looked at."""
        try:
            st = os.stat(self.root)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _close_stale(self) -> None:
        """The descriptors of roots replaced before this sync's start closed: each would keep a share unmounted
        lazily (umount -l) busy, one more at every replacement, for as long as the run lasts."""
        with self._opening:
            for held in self._stale:
                held.close()
            self._stale = []

    def close(self) -> None:
        """Close the root's descriptors; a later write opens it again."""
        with self._opening:
            for held in [*self._stale, *([self._dir] if self._dir else [])]:
                held.close()
            self._dir, self._stale = None, []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # --- reading, as untrusted -------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The root's names, sorted, of a root of MAX_DIR_ENTRIES entries at most (untrusted.listed, read lazily):
        one others filled past that is never read whole, nor taken for a whole listing (a step past the bound
        unseen would be synced again, or pruned around): RootCrowded, an OSError, which fails the sync or the
        fetch as one that cannot be read now, retried, saying so. [] when the root is not there, or no directory
        (what fsspec's ls found there: no step; the fetch's own look says what the root is)."""
        try:
            return sorted(listed(self.root))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except TooManyEntries:
            raise RootCrowded(errno.EOVERFLOW, f"run.remote holds more than {MAX_DIR_ENTRIES:,} entries: {self.root} "
                                               f"not listed past that (filled by someone? remove what is not this "
                                               f"run's)", self.root) from None

    def steps(self) -> Steps:
        """Step directory names, oldest first, of this user's real directories only (remote_write.why_foreign): another
        user's entry or a link by a step name is no checkpoint of this run's, whatever its name and manifest say.
        Counted, it would stop the sync (a planted step-99999999 is "newer" than every checkpoint of the run), be
        fetched for a resume, or count towards sync.keep; it is passed by, and returned in `passed_by` with what it
        is, for the sync to say."""
        ours, passed_by = [], {}
        for name in super().steps().ours:
            if why := remote_write.why_foreign(self.path(name)):
                passed_by[name] = why
            else:
                ours.append(name)
        return Steps(ours, passed_by)

    def open(self, *names: str):
        """A file opened for reading as untrusted: no link followed from the root down (one placed there may point
        at another user's file, /dev/zero or a FIFO), a regular file only, never a blocking open. Raises
        FileNotFoundError, Unreadable (what was found instead) or OSError."""
        return os.fdopen(self._untrusted(lambda name, fd: open_regular(name, dir_fd=fd), *names), "rb")

    def cat(self, path: str, max_bytes: int) -> bytes:
        """A small file read as untrusted (minilmd/untrusted.py: never a FIFO nobody writes, a link, or more than
        max_bytes). Raises FileNotFoundError, Unreadable or OSError."""
        return self._untrusted(lambda name, fd: read_bytes(name, max_bytes=max_bytes, dir_fd=fd),
                               *self._names_of(path))

    def cat_own(self, path: str, max_bytes: int) -> bytes:
        """`cat` of a file a sync of this user wrote (the claim, owner.json): another user's is refused unread
        (Unreadable, kind "owner", naming its uid), as a sync refuses his entries (remote_write.why_foreign). The owner
        the share gives this user's files (root_squash) is learnt first when the file shows another (learn_own_uid),
        so that the run's own claim is never taken for another's."""
        def read(name: str, fd: int) -> bytes:
            return read_bytes(name, max_bytes=max_bytes, owner=remote_write.OWN_UIDS, dir_fd=fd)
        try:
            return self._untrusted(read, *self._names_of(path))
        except Unreadable as e:
            if e.kind != "owner" or not remote_write.learn_own_uid(self.root):
                raise
        return self._untrusted(read, *self._names_of(path))

    def _untrusted(self, read, *names: str):
        """read(name, dir_fd) of a file: each directory from the root down opened without following a link
        (remote_write.parent_dir), the file then opened by its name in the last of them. No path is looked up twice,
        so a directory on the way swapped for a link after a look is never followed (a lstat of each, then an open
        by path, followed one swapped in between). A link on the way is refused (Unreadable)."""
        path = self.path(*names)
        try:
            with remote_write.parent_dir(self.root, names, self.show) as parent:
                return read(names[-1], parent.fd)
        except remote_write.NotOurs as e:
            if e.errno != errno.ELOOP:
                raise  # ENOTDIR: a file where a directory belongs, an OSError as its open by path raised
            raise Unreadable(str(e), path, kind="link") from None
        except FileNotFoundError:
            raise FileNotFoundError(path) from None  # the root or a directory on the way
        except Unreadable as e:
            if e.missing:
                raise FileNotFoundError(path) from None
            if e.os_error is not None:
                raise e.os_error from None  # a failing mount stays an OSError: the remote is retried
            raise Unreadable(e.why, path, kind=e.kind) from None  # named by its whole path, as by a read by path

    def _names_of(self, path: str) -> tuple[str, ...]:
        """The names below the root of one of its paths (self.path(*names))."""
        rel = path[len(self.root):].lstrip("/") if path.startswith(self.root) else path
        return tuple(rel.split("/")) if rel else ()

    @staticmethod
    def _link(path: str) -> str | None:
        """"a symbolic link to TARGET" when path is one (never followed), else None."""
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return None
            return f"a symbolic link to {printable(os.readlink(path))}"
        except OSError:
            return None  # missing or unreadable: the read says so

    def not_regular(self, name: str, files) -> list[str]:
        """The files of a checkpoint (`files` relative to `name`, "/" between directories) that are there but are not
        regular files, or lie past a link (a FIFO listed with size 0 would block its hash and its download for ever;
        a link may point at another user's file, /dev/zero, a FIFO): problems of the checkpoint, found before any of
        it is opened, each saying what was found."""
        found = [self._found(name, *f.split("/")) for f in files]
        return [f"{where}: {what}" for where, what in filter(None, found)]

    def _found(self, *names: str) -> tuple[str, str] | None:
        """(where, what) for the first link on the way from the root to names, or names itself when it is there
        and not a regular file; None for a regular file reached without a link (or missing: its size says so)."""
        for i in range(1, len(names) + 1):
            if found := self._link(self.path(*names[:i])):
                return self.show(*names[:i]), f"{found}, not followed"
        try:
            mode = os.lstat(self.path(*names)).st_mode
        except OSError:
            return None
        return None if stat.S_ISREG(mode) else (self.show(*names), f"{file_kind(mode)}, not a regular file")

    def why_foreign(self, name: str) -> str | None:
        """What `name` is when it is no real directory of this user's (a link, another user's entry:
        remote_write.why_foreign), None when it is, or is not there."""
        return remote_write.why_foreign(self.path(name))

    def made_here(self, name: str) -> bool:
        """Whether the step `name` of this run (`steps`: by its owner) was made by a sync of this user
        (remote_write.not_made_here): on a share that gives every file one owner, another user's step is this run's
        by its owner alone. A look that fails says no."""
        try:
            return remote_write.not_made_here(self.path(name)) is None
        except OSError:
            return False

    def age(self, name: str) -> float:
        """Seconds since `name` was last modified, from its own entry (no link followed); 0 where unknown."""
        try:
            return max(0.0, time.time() - os.lstat(self.path(name)).st_mtime)
        except OSError:
            return 0.0

    def free(self) -> int | None:
        """Bytes an unprivileged writer may still use here (None: not measurable)."""
        with contextlib.suppress(OSError):
            return shutil.disk_usage(self.root).free
        return None

    def inodes_if_none_left(self) -> int | None:
        """The inode count here when none is left for a new file (fsio.no_inode_left): what a full remote ran
        out of, when not bytes."""
        return fsio.inodes_if_none_left(self.root)

    # --- writing, at the root's descriptor -------------------------------------------------------------------------
    def put(self, local: Path, *names: str) -> int:
        """Copy a local file to a new file of the remote, fsynced; the bytes written. The file is made new (O_EXCL:
        never one already there, nor a link placed at its name) below directories none of which is a link
        (remote_write.py): a link placed there by another user never redirects the write."""
        with os.fdopen(remote_write.open_new(self._root(), names, self.show), "wb") as out, open(local, "rb") as src:
            n, unflushed = 0, 0
            while chunk := src.read(CHUNK):
                out.write(chunk)
                n += len(chunk)
                unflushed += len(chunk)
                if unflushed >= FLUSH_EVERY_BYTES:  # what the progress says is on the server, not in page cache
                    out.flush()
                    os.fdatasync(out.fileno())
                    unflushed = 0
                self.moved(len(chunk))  # the sync's progress (Remote.moved)
            out.flush()
            os.fsync(out.fileno())
        return n

    def makedirs(self, *names: str) -> None:
        """The root, made when missing, and opened and checked (`_root`); each directory of names below it made new
        (a name already taken, a link placed there included, is refused: NotOurs, an OSError saying what it is),
        none written through a link."""
        self._make_root()
        if names:
            remote_write.mkdir_new(self._root(), names, self.show)
        else:  # a sync's start: the root checked again, and opened again when its path leads elsewhere now
            self._close_stale()
            self._reopen()

    def _make_root(self) -> None:
        """The root made when missing, with the directories above it that are not there, unless the rule of
        path_checks.remote_parents_refused (the one `run --check` refuses by) says no: a chain made from the top
        level (a typo in a share's path) or below an unmounted share's mount point, or a root made or written on a
        configured mount point nothing is mounted on now (the root there or not), would put the "durable" copy on
        the local disk. The sync fails then, is retried, and says so, until the share is back. Made by
        construction, never by path: walked from "/" through descriptors (place_rule.walk_to), each directory judged
        by open_root's rule on what its descriptor holds as it is reached, each missing one made (mkdirat) in its
        parent already judged, then opened without following a link. So nothing is made below a directory the rule
        refuses (another user's, one others may rearrange), nor in the place of one a group member of a team
        directory on the way swapped for a link or his own directory after a look: PlaceRefused, naming what was
        found (before, the place was judged by path and then made by path, os.makedirs, through whatever stood there
        by then). The owner a squashing share gives what is made is learnt as open_root learns it."""
        if missing := remote_parents_refused(self.root):  # the root there too: on an unmounted share's stub
            raise FileNotFoundError(errno.ENOENT, f"{self.url}: {missing}")
        try:
            if stat.S_ISDIR(os.stat(self.root).st_mode):
                return
        except (FileNotFoundError, NotADirectoryError):
            pass  # not there (or a file on the way: said below)
        except OSError as e:  # EIO, ESTALE of a share that answers badly: that, as it is, not "gone"
            if e.errno != errno.ELOOP:
                raise
        remote_root.judge_missing(self.url, self.made, self.synced_before)  # the run's root gone: never made again
        if not os.path.isdir(there := _nearest_there(self.root)):  # a link to nowhere, a file: say what it is (not
            from minilmd.shared_place import look  # "File exists"), nor make where a link of the user's leads

            where = "" if there == os.path.normpath(self.root) else f": {there}"
            raise FileExistsError(errno.EEXIST, f"{self.url}{where} is {look(there, LATEST)}")
        what, advice = f"what minilmd makes in {self.root}", "choose a directory only you (and root) can change"
        remote_write.owner_learnt(self.root, lambda: os.close(walk_to(
            self.root, "run.remote", what, advice, 0o777, team_root=True, team_above=True,
            owners=remote_write.OWN_UIDS)[0]))

    def remember_root(self) -> None:
        """The root, claimed, recorded as this run's remote (remote_root.remember) when the record has none."""
        remote_root.remember(self.url, self._root(), self.made)

    def make_tmp(self, target: str, *below: str, taken=lambda found, fresh: None,
                 kept: Callable[[str], str | None] = lambda name: None) -> str:
        """Remote.make_tmp's temporary directory. Anyone can predict `target` (host and pid): where it holds what is
        not this sync's (a link, another user's entry: NotOurs) that is left as it is, never written through, and a
        fresh name is made instead, `target-XXXXXXXX.tmp` (random): the same host and pid, which
        tmpnames.remote_tmp_owner reads back, so the clean-up of this pid's leftovers still takes it. `taken(what was
        found, the fresh name)` says so. Without it one other user could keep every checkpoint from ever reaching
        the remote. `kept(target)`: what the caller's own earlier try left there that must never be removed (what
        stood at the final name, which publish_unless_taken could neither put back nor set aside), None when nothing
        is: a fresh name then too."""
        self._make_root()
        if self._root().lstat(target) is not None and (why := kept(target)):
            return self._fresh_tmp(target, below, why, taken)
        self.rm(target)
        try:
            self._make_recorded(target, below)
            return target
        except remote_write.NotOurs as e:
            with contextlib.suppress(OSError):
                self.rm(target)  # ours when what was taken lies below it: only this run's recorded directory goes
            return self._fresh_tmp(target, below, str(e), taken)

    def _make_recorded(self, name: str, below: tuple[str, ...]) -> None:
        """The directory `name` made new in the root and recorded as this run's before anything is made or copied
        into it (remote_made.Made: what a later sync may remove), then `below` in it."""
        self.makedirs(name)
        self.made.record(name, remote_made.made_new(self._root(), name))
        if below:
            remote_write.mkdir_new(self._root(), (name, *below), self.show, made=1)

    def _fresh_tmp(self, target: str, below: tuple[str, ...], found: str, taken) -> str:
        fresh = fresh_tmp_name(target, secrets.token_hex(4))
        self._make_recorded(fresh, below)
        taken(found, fresh)
        return fresh

    def rm(self, name: str, file: bool = False, was: str | None = None, claim: bytes | None = None) -> str | None:
        """Remove what a sync made, a name of the root: None when removed (or not there). Only a real directory (a
        regular file when `file`: a pointer's temp file) owned by this user and proven this run's
        (remote_made.why_kept; `was`: the name it is recorded by), whatever its name says (others write and rename
        there too), through the root's descriptor: anything else (another user's, a link, ...) is left, and what it
        is returned. `claim`: this run's claim, which the claim's temporary file of a write cut may hold."""
        root = self._root()
        st = root.lstat(name)
        why = remote_write.remove_ours(root, name, self.made, file, was, claim)
        if why is None and st is not None and not file:  # every record of the name: one proven by it after a remount
            self.made.forget(was or name)  # holds the inode it had before
        return why

    def set_aside(self, name: str, reason: str) -> str | None:
        """`quarantine`: where it went."""
        return self.quarantine(name, reason)

    def quarantine(self, name: str, reason: str) -> str:
        """Set a damaged checkpoint aside into quarantine/, with its reason: where it went. NotOurs (an OSError)
        saying what was found when it or quarantine/ is not this user's real directory (a link, another user's):
        nothing of theirs is moved, nor written into."""
        return remote_write.set_aside(self._root(), name, reason, self.show)

    def write_latest(self, name: str, pointer: str = LATEST) -> None:
        """A temp file made new at the root's descriptor, fsync, rename there."""
        self._root().write_atomic(pointer, (name + "\n").encode(), perms.file_mode(), tag=self.tmp_tag)


def open_remote(url: str, tmp_tag: str = "") -> Remote:
    """The remote at `url`: a LocalRemote for a local path (a plain path, file://, local://), a Remote for any other
    fsspec store. ValueError or ImportError for a URL fsspec cannot open."""
    opened = open_fs(url)
    kind = LocalRemote if opened.local else Remote
    return kind(url, tmp_tag, (opened.fs, opened.root))
