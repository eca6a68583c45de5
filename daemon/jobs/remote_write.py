"""Writing to and removing from a local remote (daemon/jobs/remote.py) that others may write too.

Whoever can write the remote's root can place a link at a name a sync is about to make (its temporary copy, the
LoRA base's, a file in it), pointing at a file the sync's user may write (~/.bashrc): a write following it would
land there. So every directory a sync makes is made new (mkdir, never "exist ok": a name already taken is
refused, saying what it is), every file opened O_CREAT|O_EXCL|O_NOFOLLOW, and each directory on the way from the
root is opened without following a link (a descriptor, not a path: nothing can be swapped in between). A
pointer's temp file is Dir.write_atomic's: O_EXCL|O_NOFOLLOW too. And only what a sync of this user makes is ever
removed or set aside (quarantine/): a real directory (a pointer's temp file: a regular file) owned by this user
(lstat st_uid), never a link nor another user's entry, whatever its name says; what is left is said. Every write
starts at the root's descriptor, opened once and checked by dirfd's rule (LocalRemote._root: minilmd/dirfd.py's Dir),
never at its path: the root, or a directory above it, swapped for a link afterwards redirects nothing. Torch-free.

An owner proves nothing on a share that gives every file one owner (NFS's all_squash; root_squash for runs as root):
there another user's directory is owned by the very uid this process's own get (OWN_UIDS). So where the share gives
this process's directories another uid than its own, each one a sync makes in the root also holds a mark
(names.REMOTE_MARK, written as it is made: `mkdir_new`) naming the local user whose sync made it, and a directory
owned by such a uid is removed or set aside only when it holds that mark too (`not_made_here`): the owner the server
shows may be anyone's there, the mark is only this user's syncs'. One without it (another user's, one copied there
by hand or synced by an older minilmd) is left, and said. This process's own uid stays proof enough: a server that
squashes gives it to no one else's files (unless it maps everyone to it: all_squash with anonuid this uid).
"""
from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import stat
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from minilmd import perms
from minilmd.daemon.jobs import remote_made
from minilmd.dirfd import OPEN_DIR, RENAME_NOREPLACE, Dir, PlaceRefused, renameat2
from minilmd.names import LATEST, QUARANTINE, REASON_FILE, REMOTE_MARK, is_step_name, quarantine_name
from minilmd.perms import LearntOwners, owned_by_me, owned_by_me_or_root, owner_in, squash_uids
from minilmd.proc_info import this_maker
from minilmd.tmpnames import atomic_tmp_prefix, pointer_tmp_tag
from minilmd.untrusted import Unreadable, dir_names, file_kind, printable, read_bytes

OWN_UIDS = LearntOwners()
"""The owners this process's own entries on a remote show: its uid (perms.own_uid, asked at each look, never a copy
taken at import), and the one a server maps it to, learnt from each directory `mkdir_new` makes (NFS's root_squash,
the default, makes root's files the anonymous user's: a run as root in a container would otherwise never delete its
own old checkpoints and fill the share). On such a share the anonymous user's entries count as this user's for what
a sync reads (another squashed root's, or every user's under all_squash, look the same from here); what it removes
or sets aside needs this user's mark too (`not_made_here`)."""


MARK_MAX_BYTES = 256
"""A REMOTE_MARK is one short line: a longer one is not read (nor anyone's mark)."""


class NotOurs(OSError):
    """An entry of the remote a sync would write through, replace, remove or move into, and may not: its message
    says what it is (an OSError: the sync fails and is retried, as on any error of the remote)."""

    def __str__(self) -> str:
        return str(self.strerror)


Show = Callable[..., str]
"""Remote.show: how a path below the root is named in a message."""


def what_is(path: str) -> str:
    """What the entry at path is, itself (never followed): "a symbolic link to X", "a directory owned by uid N"."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return e.strerror or "unreadable"
    if stat.S_ISLNK(st.st_mode):
        with contextlib.suppress(OSError):
            return f"a symbolic link to {printable(os.readlink(path))}"
        return "a symbolic link"
    owner = "" if owner_in(st, OWN_UIDS) else f" owned by uid {st.st_uid}"
    return f"{file_kind(st.st_mode)}{owner}"


def why_foreign(path: str, file: bool = False, st: os.stat_result | None = None) -> str | None:
    """Why the entry at path is not one a sync of this user makes (a real directory, or a regular file when `file`,
    owned by this user), None when it is, or is not there. `st`: the entry's lstat the caller already took (judged
    as it is, not looked at again), so that what the caller then removes by that identity is the one judged."""
    if st is None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
    if stat.S_ISLNK(st.st_mode) or not owner_in(st, OWN_UIDS):
        return what_is(path)
    if not (stat.S_ISREG(st.st_mode) if file else stat.S_ISDIR(st.st_mode)):
        return f"{file_kind(st.st_mode)}, not what a sync makes"
    return None


def mark() -> bytes:
    """What names.REMOTE_MARK holds in a directory a sync of this process's user made: that user's uid here, as the
    server never changes it (it maps owners, not what a file holds)."""
    return f"made by a sync of uid {perms.own_uid()}\n".encode()


def not_made_here(path: str, expected: tuple[int, int] | None = None) -> str | None:
    """Why the directory at path is not one a sync of this user made, None when it is one, or is not there: what may
    be removed or set aside. `why_foreign`, and where its owner is not this process's own uid but one the share gives
    new files, this user's REMOTE_MARK in it (the owner proves nothing there). `expected`: the (device, inode) the
    caller took before this look, which the directory opened here must have (another moved there since: refused),
    so that what the caller then removes or moves by that identity is the very directory judged here."""
    if why := why_foreign(path):
        return why
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(path, OPEN_DIR)
        try:
            st = os.fstat(fd)
            uid = st.st_uid
            if expected is not None and (st.st_dev, st.st_ino) != expected:
                return "a directory moved there while it was looked at: left"
            if owned_by_me(st):
                return None
            if read_bytes(REMOTE_MARK, max_bytes=MARK_MAX_BYTES, dir_fd=fd) == mark():
                return None
            found = f"whose {REMOTE_MARK} is another user's"
        except Unreadable as e:
            found = f"without a {REMOTE_MARK}" if e.missing else f"whose {REMOTE_MARK} cannot be read ({e.why})"
        finally:
            os.close(fd)
        return f"a directory owned by uid {uid} (the owner this share gives new files) {found}"
    return None


def foreign_entries(root: str, own: dict[str, bool]) -> list[str]:
    """What stands at the run's own names in a local remote's root (`own`: name -> whether it is a file: LATEST,
    BEST, the LoRA base's `init`) that a sync of this user would not make, one `NAME there is WHAT` each: another
    user's entry (in a sticky directory this user may not replace it: every sync would fail; elsewhere it would
    decide what a resume loads), a link, a FIFO. Where one is found, the owner the share gives this user's files
    (NFS's root_squash or all_squash, an idmap mismatch) is learnt first (learn_own_uid), so that a run's own
    pointer is never taken for another's."""
    if not os.path.isdir(root):  # not there, or not answering: what sync waits for (in a bounded probe's thread)
        return []

    def found() -> list[tuple[str, str]]:
        return [(name, why) for name, file in own.items() if (why := why_foreign(os.path.join(root, name), file))]

    problems = found()
    if problems:
        learn_own_uid(root)
        problems = found()
    return [f"{name} there is {why}" for name, why in problems]


def learn_own_uid(root: str) -> bool:
    """Learn (OWN_UIDS) the owner the share gives this process's new files (given_owner) in the root once dirfd's
    rule accepts it (open_root: where a sync writes anyway; before that only in a place _learning_place allows):
    whether an owner not known before was learnt. Nothing learnt, nor written, where the rule refuses the root,
    or it cannot be opened or written: never in another user's directory (before: in any root opened by path)."""
    known = len(OWN_UIDS)
    with contextlib.suppress(OSError, PlaceRefused), open_root(root) as opened:
        OWN_UIDS.learn(given_owner(opened))
    return len(OWN_UIDS) > known


def given_owner(root: Dir) -> int:
    """The owner the share gives this process's new files: one file made new in the root (Dir.create_new: O_EXCL, no
    link) under a pointer's temporary name with a random end (tmpnames.remote_tmp_owner: a sync's clean-up knows it; a
    name another user planted, or a crash left, is passed by for another), its owner read from the open descriptor
    (nothing to swap), then removed through the root's descriptor when the name still holds that very file.
    OSError when the root cannot be written (nothing learnt)."""
    prefix = atomic_tmp_prefix(LATEST) + pointer_tmp_tag(*this_maker()) + "owner"
    fd, name = root.create_new(prefix, ".tmp", 0o600)
    try:
        made = os.fstat(fd)
        with contextlib.suppress(OSError):
            root.remove_file(name, (made.st_dev, made.st_ino))
    finally:
        os.close(fd)
    return made.st_uid


def open_root(root: str) -> Dir:
    """A local remote's root opened and checked by dirfd's rule (Dir.open: no link on the way but one of root's or
    this user's, no directory above it another user owns or can rearrange; the root itself may be a team directory
    others write, by its owner's choice, but it must be root's, this user's or OWN_UIDS' (`team_root`: a directory
    another user made first at its name is his to chmod 700 with the run's only checkpoints in it), and so may the
    directories above it, group-writable ones
    of root's or this user's, never world-writable unless sticky: `team_above`, /nfs/team/alice/run1 under a
    2775 /nfs/team), for LocalRemote._root. The directories above it that a sync made (LocalRemote._make_root) are, on a
    squashing share, the owner the share gives this user's new files (OWN_UIDS), not this user's: where the rule
    refuses one for an owner that may be that one (`_learning_place`), it is learnt and the rule asked again
    counting it as this user's (a directory of it above the root only when no one but its owner may write it:
    place_rule). PlaceRefused (a ValueError) when the rule refuses it; FileNotFoundError when it is not there."""
    opened = owner_learnt(root, lambda: Dir.open(root, "run.remote", team_root=True, team_above=True,
                                                   owners=OWN_UIDS))
    opened.owners = OWN_UIDS  # a directory a sync makes may show the owner the share maps this user to
    return opened


Found = TypeVar("Found")


def owner_learnt(root: str, act: Callable[[], Found]) -> Found:
    """act() (open_root's open, LocalRemote._make_root's walk), asked once more where the rule refused it for a
    directory of the owner a squashing share gives this user's new files and that owner could be learnt
    (_learning_place); the refusal as it came otherwise."""
    try:
        return act()
    except PlaceRefused:
        if (where := _learning_place(root)) is None:
            raise
        learnt = False
        with where, contextlib.suppress(OSError):
            learnt = OWN_UIDS.learn(given_owner(where))
        if not learnt:
            raise
    return act()


def _learning_place(root: str) -> Dir | None:
    """Where open_root may learn the owner the share gives new files after a refusal, opened (None where it must
    not): only where a directory on the way has an owner neither root nor in OWN_UIDS that is a squash uid
    (_foreign_owner, squash_uids: nobody), in the root once it is there, or, before the first sync made it, in the
    nearest directory above it; and that directory, judged on its descriptor (nothing swapped in after a look),
    this user's or that owner's and writable by its owner alone. Never another user's directory, nor one others
    may write (/tmp, a team's, nobody's 2775): before, the root was written into whoever owned it, and only then
    refused."""
    if (foreign := _foreign_owner(root)) is None or not owner_in(foreign, squash_uids()):
        return None
    there = _nearest_there(root)
    try:
        opened = Dir(os.open(there, OPEN_DIR), pathlib.Path(there))
    except OSError:
        return None
    with contextlib.suppress(OSError):
        st = os.fstat(opened.fd)
        ours_or_its = owned_by_me(st, also=OWN_UIDS) or owner_in(st, (foreign.st_uid,))
        if ours_or_its and not perms.others_can_write(st, opened.fd):
            return opened
    opened.close()
    return None


def _foreign_owner(root: str) -> os.stat_result | None:
    """The first directory on the way to root (root included, when there) whose owner is neither root nor in
    OWN_UIDS, as lstat saw it: read from the directories themselves, not from a refusal's words."""
    path = pathlib.PurePath(os.path.abspath(root))
    for here in [*reversed(path.parents), path]:
        try:
            st = os.lstat(here)
        except OSError:
            return None
        if not owned_by_me_or_root(st, also=OWN_UIDS):
            return st
    return None


def _nearest_there(root: str) -> str:
    """root, or the nearest directory above it that is there (where a sync's makedirs would make the rest)."""
    path = os.path.abspath(root)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def root_refused(root: str) -> str | None:
    """Why open_root refuses a local remote's root (the sync would at every try), None when it opens it or it is not
    there yet (the first sync makes it: the directories above it that are there are judged all the same)."""
    try:
        open_root(root).close()
    except PlaceRefused as e:
        return str(e)
    except FileNotFoundError:
        pass
    return None


def in_root(root: Dir, *names: str) -> str:
    """A path to names below the root's descriptor (Dir.inside, /proc/self/fd/N), for a look (why_foreign, what_is):
    the last name lstat'ed in the directory the descriptor holds, whatever the root's path leads to now."""
    return "/".join([str(root.inside), *names])


def remove_ours(root: Dir, name: str, made: remote_made.Made, file: bool = False, was: str | None = None,
                claim: bytes | None = None) -> str | None:
    """Remove `name` of the root when a sync of this user made it (a directory: not_made_here; a pointer's temp file:
    why_foreign) and it is proven this run's (remote_made.why_kept: what a name alone never proves, in a root others
    may rename within; `made`: the run's record, `was`: the name it was recorded by); else leave it and say what it
    is. None when removed or not there. Either goes only while its name still leads to the very entry judged; a
    directory through descriptors (Dir.remove_tree: no link followed inside it)."""
    st = root.lstat(name)  # first: the identity removed below is the one judged
    if st is None:
        return None
    path = in_root(root, name)
    if why := (why_foreign(path, file, st) if file else not_made_here(path, (st.st_dev, st.st_ino))):
        return why
    if why := remote_made.why_kept(root, name, st, made, file, was, claim):
        cut_before_its_record = not (file or was is not None or is_step_name(name))
        if not (cut_before_its_record and _remove_unrecorded(root, name, (st.st_dev, st.st_ino))):
            return why
        return None
    if file:
        if root.remove_file(name, (st.st_dev, st.st_ino)) or root.lstat(name) is None:
            return None
        return "a file not removed (another one moved there while it was looked at): left"
    if root.remove_tree(name, (st.st_dev, st.st_ino)) or root.lstat(name) is None:
        return None
    return "a directory not removed whole (another one moved there meanwhile, or a tree too deep): left"


def _remove_unrecorded(root: Dir, name: str, identity: tuple[int, int]) -> bool:
    """Remove the temporary directory `name` that a sync of this user made and was cut (SIGKILL) before it recorded
    it: the record holds the directory's inode, so it is written after the mkdir, and before anything is copied
    into it. Such a one is empty but for this user's REMOTE_MARK (not_made_here has judged it this user's): nothing
    of anyone's is in it. The mark goes, then the name by rmdir, which leaves a directory anything was put in
    meanwhile. False (left) for anything else: a copy's files are proof only through the record."""
    try:
        with Dir.at(root, name) as sub:
            if sub.identity != identity:
                return False
            held = dir_names(sub.fd, max_entries=1)  # Unreadable past one: left
            if held == [REMOTE_MARK]:
                if read_bytes(REMOTE_MARK, max_bytes=MARK_MAX_BYTES, dir_fd=sub.fd) != mark():
                    return False
                sub.remove_file(REMOTE_MARK)
            elif held:
                return False
        root.remove_dir(name)
    except (OSError, Unreadable):
        return False
    return True


@contextlib.contextmanager
def parent_dir(root: str | Dir, names: tuple[str, ...], show: Show) -> Iterator[Dir]:
    """The directory that holds names[-1], reached from root one directory at a time (Dir.at: none of them a link;
    refused, saying what it is: NotOurs, an OSError the sync retries, of errno ELOOP for a link, ENOTDIR for
    anything else that is not a directory). `root`: the root's path (a read: the remote as configured) or, for a
    write, its Dir (LocalRemote._root), whose descriptor is where the walk starts; a write's directories below the
    root are this user's (OWN_UIDS: one swapped in by another user since it was made is NotOurs, not written into).
    Every write below the root goes through the Dir yielded here: its descriptor, never a path."""
    if isinstance(root, Dir):
        here = Dir(os.dup(root.fd), root.path)
    else:
        here = Dir(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), pathlib.Path(root))
    try:
        for i, name in enumerate(names[:-1]):
            try:
                below = Dir.at(here, name)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                # Linux says ENOTDIR for a link too (O_DIRECTORY): the entry itself tells a reader which it met
                found = errno.ELOOP if _is_link(here, name) else errno.ENOTDIR
                where = in_root(root, *names[:i + 1]) if isinstance(root, Dir) else "/".join([root, *names[:i + 1]])
                raise NotOurs(found, f"{show(*names[:i + 1])} is {what_is(where)}: not followed") from None
            here.close()
            here = below
            if isinstance(root, Dir) and not owner_in(st := os.fstat(here.fd), OWN_UIDS):  # writes: into ours only
                raise NotOurs(errno.EPERM, f"{show(*names[:i + 1])} is a directory of uid {st.st_uid}, not made by "
                                           f"this user's sync: never written into")
        yield here
    finally:
        here.close()


def _is_link(where: Dir, name: str) -> bool:
    with contextlib.suppress(OSError):
        st = where.lstat(name)
        return st is not None and stat.S_ISLNK(st.st_mode)
    return False


def _taken(root: Dir, names: tuple[str, ...], show: Show) -> NotOurs:
    what = what_is(in_root(root, *names))
    return NotOurs(errno.EEXIST, f"{show(*names)} is already there ({what}): not made by this sync, "
                                         f"never written into")


def mkdir_new(root: Dir, names: tuple[str, ...], show: Show, made: int = 0) -> None:
    """Make each directory of names below root, every one new (the umask gives its mode, as the run's policy); the
    first, in the root, holding this user's REMOTE_MARK where the share gives it another owner than this process's
    uid (not_made_here: what a sync may remove later). `made`: how many of names the caller made already."""
    for i in range(made + 1, len(names) + 1):
        with parent_dir(root, names[:i], show) as parent:
            try:
                parent.make_dir(names[i - 1])
            except FileExistsError:
                raise _taken(root, names[:i], show) from None
            st = _made_owner(root, parent, names[:i], show)
        if i == 1 and not owned_by_me(st):  # a squashing share: the owner cannot tell this user's from another's
            _mark_new(root, names[0], show)


def _made_owner(root: Dir, parent: Dir, names: tuple[str, ...], show: Show) -> os.stat_result:
    """The directory just made at names (in `parent`) as lstat sees it, of an owner the share gives this process's
    files. It is read from the name, which another user who can write there may have swapped for his own directory
    since the mkdir: so an owner not known yet is learnt from a file made new (given_owner: O_EXCL, read from
    its descriptor), never from what the name shows; a directory at the name owned by anyone else is his (NotOurs:
    the caller's copy takes another name), and his uid never becomes "ours"."""
    st = parent.lstat(names[-1])
    if st is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), names[-1])
    if not owner_in(st, OWN_UIDS):
        try:
            OWN_UIDS.learn(given_owner(root))
        except OSError as e:  # the directory goes again: unmarked and of an unknown owner, no later sync removes it
            with contextlib.suppress(OSError):
                parent.remove_dir(names[-1])
            raise OSError(e.errno, f"{show(*names)}: cannot learn the owner this share gives new files "
                                   f"({e.strerror or e}); the directory just made was removed") from None
    if not owner_in(st, OWN_UIDS):
        raise _taken(root, names, show)
    return st


def _mark_new(root: Dir, name: str, show: Show) -> None:
    """Write this user's REMOTE_MARK into the directory `name` just made in root; where that fails (a full share),
    the directory goes again, through its descriptor: unmarked, no later sync could remove it."""
    try:
        with os.fdopen(open_new(root, (name, REMOTE_MARK), show), "wb") as f:
            f.write(mark())
    except BaseException:
        with contextlib.suppress(OSError), parent_dir(root, (name, REMOTE_MARK), show) as made:
            made.remove_file(REMOTE_MARK)
            with parent_dir(root, (name,), show) as top:
                top.remove_dir(name)
        raise


def open_new(root: Dir, names: tuple[str, ...], show: Show) -> int:
    """A new file at names below root, opened for writing: never one already there, nor through a link."""
    with parent_dir(root, names, show) as parent:
        try:
            return parent.open_new(names[-1])
        except FileExistsError:
            raise _taken(root, names, show) from None


def set_aside(root: Dir, name: str, reason: str, show: Show) -> str:
    """Move this user's directory root/name into root/quarantine/ (made new when missing; when there, a real
    directory of this user) as `<name>-<time>`, with reason.txt saying why, as checkpoint_dirs.quarantine does in
    scratch: its path. NotOurs, saying what was found, when either is not this user's: nothing
    is moved into, nor written into, another's directory."""
    st = root.lstat(name)  # first: the identity moved below is the one not_made_here judges
    judged = None if st is None else (st.st_dev, st.st_ino)
    for entry, why in ((name, not_made_here(in_root(root, name), judged)),
                       (QUARANTINE, why_foreign(in_root(root, QUARANTINE)))):  # moved into, not moved
        if why:
            raise NotOurs(errno.EEXIST, f"{show(entry)} is {why}: not this run's, left as it is")
    with contextlib.suppress(NotOurs):  # there already: opened no-follow and its owner checked below
        mkdir_new(root, (QUARANTINE,), show)
    with parent_dir(root, (name,), show) as top, parent_dir(root, (QUARANTINE, name), show) as into:
        if not owner_in(into_st := os.fstat(into.fd), OWN_UIDS):  # made by another between the check and the open
            raise NotOurs(errno.EEXIST, f"{show(QUARANTINE)} is a directory owned by uid {into_st.st_uid}: not "
                                        f"this run's, never moved into")
        stamp, n = time.strftime("%Y%m%dT%H%M%S"), 1
        while into.lstat(dest := quarantine_name(name, stamp, n)) is not None:
            n += 1
        top.rename(name, into, dest)  # a link swapped in moves as itself
        if into.identity_of(dest) != judged:  # another moved there after the look: back where it was
            back = False
            with contextlib.suppress(OSError):
                back = renameat2(into.fd, dest, top.fd, name, RENAME_NOREPLACE)
            raise NotOurs(errno.EEXIST, f"{show(name)} is a directory moved there while it was looked at: not this "
                                        f"run's, " + ("put back" if back else f"left at {show(QUARANTINE, dest)}"))
    # through directories opened no-follow: a link swapped in for name is refused here, never written through
    with os.fdopen(open_new(root, (QUARANTINE, dest, REASON_FILE), show), "w", encoding="utf-8") as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {reason}\n")
    return "/".join([str(root.path), QUARANTINE, dest])
