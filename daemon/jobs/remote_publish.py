"""Publishing a complete copy under its final name on a local remote (remote_local.py's LocalRemote): a sync's
checkpoint (`rename_dir`) and the LoRA base's copy (`publish_unless_taken`), never over what another machine
published there meanwhile, and what stood there never deleted unless the caller would replace it.

Every rename is of one name in the remote's root, at the descriptor of the root opened once and checked (its _root,
minilmd/dirfd.py's Dir): renameat2's RENAME_NOREPLACE and RENAME_EXCHANGE, or dirfd's fallbacks where the file system
lacks them (NFS: a new name claimed first by an empty directory of this sync's, never a teammate's empty directory
replaced). The root, or a directory above it, swapped for a link after that open redirects none of them: before, each
was a rename by path, which followed such a link into another directory. Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

from minilmd import perms
from minilmd.daemon.jobs import remote_made, remote_write
from minilmd.daemon.jobs.remote_write import NotOurs, in_root
from minilmd.dirfd import Dir
from minilmd.dirtree import fsync_tree
from minilmd.names import kept_name
from minilmd.tmpnames import atomic_tmp_prefix
from minilmd.untrusted import Unreadable, holds_any


class LeftAside(OSError):
    """Remote.publish_unless_taken could not put back what it had moved out of the final name to look at (the name
    was taken meanwhile, or the rename back failed): what that was is kept under another name, which the message
    says; never removed."""

    def __str__(self) -> str:
        return str(self.strerror)


class Publishing:
    """LocalRemote's renames into place (a mixin: the LocalRemote's root, names and clean-up are its own)."""

    if TYPE_CHECKING:
        tmp_tag: str
        made: remote_made.Made

        def _root(self) -> Dir: ...
        def show(self, *names: str) -> str: ...
        def rm(self, name: str, file: bool = False, was: str | None = None,
               claim: bytes | None = None) -> str | None: ...
        def quarantine(self, name: str, reason: str) -> str: ...
        def intact(self, name: str, full_hash: bool = False) -> tuple[dict | None, list[str]]: ...

    def rename_dir(self, src: str, dst: str) -> None:
        """Publish the complete temporary directory src under dst, durably (local paths only: fsspec has no atomic
        rename), where nothing stands: the caller made way. What took dst since is never replaced: NotOurs when it is
        another user's entry or a link, FileExistsError (the sync fails and is retried) for anything else. The
        record of src as this run's temporary becomes one of its publish first (remote_made.Made.publishing): a
        published checkpoint renamed back to that name by another user is never removed as one, and a kill before
        the rename leaves what the next sync finishes (finish_cut_publish); it is a temporary's again when nothing
        was renamed."""
        root = self._flushed(src)
        recorded = self.made.publishing(src, dst)
        if root.rename_new(src, dst):
            os.fsync(root.fd)
            if recorded and (left := root.identity_of(src)) is not None and _nothing_at(root, dst):
                # acknowledged, not done (a flaky server): still this run's copy, as the server numbers it now (a
                # FUSE one may renumber what it was asked to rename); the sync fails, seeing no `dst`
                self.made.restore(src, [left])
            else:
                self.made.published(src)
            return
        self.made.restore(src, recorded)
        if why := self._why_foreign(dst):
            raise NotOurs(errno.EEXIST, f"{self.show(dst)} is {why}: not this run's, never replaced")
        raise FileExistsError(errno.EEXIST, f"{self.show(dst)} appeared while {self.show(src)} was made: left as it "
                                            f"is, nothing put over it")

    def finish_cut_publish(self, src: str) -> str | None:
        """Finish the publish of src that a kill cut between its record and its rename (Made.publishing): the copy,
        complete and on disk before that record, put under its final name where nothing stands (it may be a step
        published since, which another user renamed back to that name: never removed for its name alone). Where that
        step stands already, published since (the step synced again by a later sync, maybe another host's: its
        temporary names are looked at after a day), the copy is a second one of it and goes. None when no publish of
        src was begun; else what became of it, in words for the log: left where its manifest does not name that step,
        or another entry took the final name (the sync's clean-up says so, and the copy stays)."""
        root = self._root()
        st = root.lstat(src)
        final = self.made.publishing_to(src, (st.st_dev, st.st_ino)) if st is not None else None
        if final is None or st is None:
            return None
        begun = f"{self.show(src)}, a copy this run began to publish as {final}"
        if why := (self._why_foreign(src) or remote_made.why_kept(root, src, st, self.made, was=final)):
            return f"{begun}, is {why}: left as it is"
        if root.rename_new(src, final):
            os.fsync(root.fd)
            self.made.published(src)
            return f"published {self.show(src)} as {self.show(final)} (its sync was killed before it renamed it)"
        there = root.lstat(final)
        if there is None or self._why_foreign(final) or remote_made.why_kept(root, final, there, self.made):
            return f"{begun}: left as it is, {final} being taken since by what is not that step"
        if problems := self.intact(final)[1]:  # a damaged one is no second copy of this verified one
            return f"{begun}: left as it is, {final} standing since but not intact ({problems[0]})"
        if not root.remove_tree(src, (st.st_dev, st.st_ino)) and root.lstat(src) is not None:
            return f"{begun}: left as it is (another entry moved to its name while it was looked at)"
        self.made.published(src)
        return f"removed {begun} (its sync was killed before it renamed it): {final} was published since"

    def publish_unless_taken(self, src: str, dst: str, replaceable: Callable[[str], bool],
                             ours: Callable[[str], bool]) -> bool:
        """Publish the complete temporary directory src under dst, durably (local paths only), in place of what
        stands at dst only when that is still what the caller decided to replace: True when published; False when
        dst holds what the caller would not replace (left there as it was; src, the caller's copy, is the caller's
        to remove). Another machine may publish its own copy at dst between the caller's look and this rename: that
        one is never replaced nor deleted. So nothing is put over dst unseen: where nothing stands, RENAME_NOREPLACE
        (dirfd's claim where the file system lacks it); where something does, it is moved out first, by
        RENAME_EXCHANGE (swapped with src in one step) or, lacking that, a rename aside, and `replaceable(name)`
        looks at it under its new name, where no writer of dst changes it any more: what it refuses (or an entry
        not this user's real directory, or a look that fails) goes back to dst. `ours(name)`: the caller's copy is
        at name (what a swap back must bring back, before src is removed). LeftAside when what stood at dst cannot
        go back (dst taken again meanwhile, or the rename back failed): it is kept in quarantine/, or beside dst
        (names.kept_name) where quarantine/ cannot take it, never removed. NotOurs when dst is another user's entry
        or a link."""
        root = self._flushed(src)
        if root.rename_new(src, dst):
            self._published(src, dst)
            os.fsync(root.fd)
            return True
        if why := self._why_foreign(dst):
            raise NotOurs(errno.EEXIST, f"{self.show(dst)} is {why}: not this run's, never replaced")
        if not root.exchange(src, dst):
            return self._publish_aside(src, dst, replaceable, ours)
        # this copy at dst now, what stood there at src
        if self._looks(src, replaceable):
            recorded = self.made.forget(src)
            self._drop(src, was=dst)
            self.made.restore(dst, recorded)
            os.fsync(root.fd)
            return True
        try:
            root.exchange(src, dst)
        except OSError as e:
            raise self._left_aside(src, dst, f"it could not be swapped back ({e.strerror})") from None
        if not self._looks(src, ours):  # another writer swapped at dst meanwhile: what came back is not this copy
            raise self._left_aside(src, dst, "another copy took its place meanwhile")
        return False

    def replace_own(self, name: str, data: bytes) -> None:
        """The root's file `name` replaced whole by `data` while it is a regular file of this user's (the claim,
        owner.json, at `run --claim-remote`): a reader sees the old file or the new one. The new one is made new
        beside it (O_EXCL, fsynced) and swapped with it in one step (RENAME_EXCHANGE); where the file system cannot
        swap (NFS), the old one is renamed aside first and the new one renamed to `name` only while that is free
        (never over what another writer put there meanwhile). What was swapped out is removed only when it is the
        very file judged; another user's file, a link or anything else is never replaced nor removed: NotOurs,
        nothing changed (FileNotFoundError when there is none)."""
        root = self._root()
        old = root.lstat(name)
        if old is None:
            raise FileNotFoundError(errno.ENOENT, f"{self.show(name)} is not there")
        if why := remote_write.why_foreign(in_root(root, name), file=True, st=old):
            raise NotOurs(errno.EPERM, f"{self.show(name)} is {why}: not this user's, never replaced")
        judged = (old.st_dev, old.st_ino)
        tmp, made = self._written_beside(root, name, data)
        try:
            self._swap_in(root, tmp, name, judged)
        finally:  # the new file when it is not in place, else nothing (the old one is gone already)
            root.remove_file(tmp, made)
        os.fsync(root.fd)

    def put_new(self, name: str, data: bytes) -> None:
        """The root's file `name` made whole or not at all (the claim, owner.json, at a run's first sync): written
        under a temporary name of this sync's (`.owner.json.<host>-<pid>-<random>.tmp`: sync_leftovers knows it),
        fsynced, then renamed to `name` only while that is free (RENAME_NOREPLACE, or a link where the file system
        lacks it: Dir.rename_new). A write that fails (ENOSPC, EIO) leaves nothing, the temporary removed, and
        raises as it failed: a half-written file at `name` once read as a claim that is no JSON, refused for good.
        FileExistsError, nothing changed, when anything stands at `name`."""
        root = self._root()
        tmp, made = self._written_beside(root, name, data)
        try:
            if not root.rename_new(tmp, name):
                raise FileExistsError(errno.EEXIST, f"{self.show(name)} is there already: left as it is")
        finally:  # the temporary when it is not in place, else nothing (renamed away)
            root.remove_file(tmp, made)
        os.fsync(root.fd)

    def _written_beside(self, root: Dir, name: str, data: bytes) -> tuple[str, tuple[int, int]]:
        """`data` in a new file (O_EXCL) beside `name`, fsynced: its name and identity. When the write fails (a full
        remote, EIO) the file is removed and the error raised."""
        fd, tmp = root.create_new(atomic_tmp_prefix(name) + self.tmp_tag, ".tmp", perms.file_mode())
        st = os.fstat(fd)
        made = (st.st_dev, st.st_ino)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            root.remove_file(tmp, made)
            raise
        return tmp, made

    def _swap_in(self, root: Dir, tmp: str, name: str, judged: tuple[int, int]) -> None:
        """replace_own's rename: the old file (`judged`) out of `name`, removed; the new one (`tmp`) in its place."""
        if root.exchange(tmp, name):
            if self._still_judged(root, tmp, judged) and root.remove_file(tmp, judged):
                return
            root.exchange(tmp, name)  # what was swapped out is not the file judged (replaced meanwhile): put back
            raise NotOurs(errno.EEXIST, f"{self.show(name)} was replaced while it was being replaced: left as it is")
        aside = f"{tmp}-replaced"
        if not root.rename_new(name, aside):
            raise NotOurs(errno.EEXIST, f"{self.show(aside)} is taken: {self.show(name)} left as it is")
        if not self._still_judged(root, aside, judged):
            root.rename_new(aside, name)
            raise NotOurs(errno.EEXIST, f"{self.show(name)} was replaced while it was being replaced: left as it is")
        if not root.rename_new(tmp, name):
            raise NotOurs(errno.EEXIST, f"{self.show(name)} was made by another writer meanwhile: left as it is "
                                        f"(the file it replaced is at {self.show(aside)})")
        root.remove_file(aside, judged)

    @staticmethod
    def _still_judged(root: Dir, name: str, judged: tuple[int, int]) -> bool:
        """Whether `name` is still the file replace_own judged: its identity, and still this user's regular file (a
        file put in its place may get the freed inode's number again)."""
        st = root.lstat(name)
        return st is not None and (st.st_dev, st.st_ino) == judged and \
            remote_write.why_foreign(in_root(root, name), file=True, st=st) is None

    def _flushed(self, src: str) -> Dir:
        """The root, once every file and directory of src is on disk (fsynced through descriptors)."""
        root = self._root()
        with Dir.at(root, src) as tree:
            fsync_tree(tree.fd)
        return root

    def _why_foreign(self, name: str) -> str | None:
        """remote_write.why_foreign of `name` in the root as opened (its descriptor), never by the root's path."""
        return remote_write.why_foreign(in_root(self._root(), name))

    def _publish_aside(self, src: str, dst: str, replaceable: Callable[[str], bool],
                       ours: Callable[[str], bool]) -> bool:
        """publish_unless_taken where the file system cannot exchange (NFS): what stands at dst is renamed aside,
        looked at there, then either replaced or renamed back. A reader may find dst missing meanwhile."""
        root = self._root()
        aside = self._aside_name(src, dst, lambda name: self._looks(name, ours) or self._looks(name, replaceable))
        if not root.rename_new(dst, aside):  # a FileNotFoundError (gone meanwhile): the caller retries
            raise NotOurs(errno.EEXIST, f"{self.show(aside)} is {remote_write.what_is(in_root(root, aside))}: not "
                                        f"this run's, never replaced")
        if not self._looks(aside, replaceable):
            try:
                if root.rename_new(aside, dst):
                    return False
                why = "another copy took its place meanwhile"
            except OSError as e:  # EIO, ESTALE: where it is now is said, never left unsaid at the aside name
                why = f"it could not be renamed back ({e.strerror})"
            self._drop(src)  # this copy: the caller has nothing to remove
            raise self._left_aside(aside, dst, why)
        published = root.rename_new(src, dst)  # False: another copy took the name meanwhile; it stays
        if published:
            self._published(src, dst)
        self._drop(aside, was=dst)  # what the caller would replace, either way
        os.fsync(root.fd)
        return published

    def _published(self, src: str, dst: str) -> None:
        """This run's copy renamed from src to dst: recorded by its new name (remote_made.Made), so that a later
        push may replace it (a damaged copy of this base) and no one renaming it back to src has it removed."""
        self.made.restore(dst, self.made.forget(src))

    def _aside_name(self, src: str, dst: str, removable: Callable[[str], bool]) -> str:
        """`<src>-replaced`, where what stands at dst is moved to be looked at; an earlier try's removed first when
        `removable` (this push's copy, or what it would replace anyway). One holding anything else (another base's
        copy an earlier try could neither put back nor set aside, a look that fails) is left as it is, and a fresh
        name taken instead: it is never removed."""
        aside = f"{src}-replaced"
        if self._root().lstat(aside) is None or (removable(aside) and self.rm(aside, was=dst) is None):
            return aside
        return f"{aside}-{secrets.token_hex(4)}"

    def _looks(self, name: str, like: Callable[[str], bool]) -> bool:
        """Whether `name` is this user's real directory and like(name) says yes; a look that fails says no."""
        try:
            return self._why_foreign(name) is None and like(name)
        except (OSError, Unreadable):
            return False

    def _drop(self, name: str, was: str | None = None) -> None:
        """Remove a copy replaced (`was`: the name this run recorded it by, remote_made.Made); one that cannot be is
        a leftover of this host, which a later sync removes when it is proven this run's, or says."""
        with contextlib.suppress(OSError):
            self.rm(name, was=was)

    def _left_aside(self, name: str, dst: str, why: str) -> LeftAside:
        """What stood at dst, now at `name`, could not go back: kept in quarantine/ (no clean-up of temporary names
        takes it there); where quarantine/ cannot take it (another user's entry or a link there), renamed beside
        dst to names.kept_name, which nothing removes: `name` is this process's temporary name, which its next
        push would make again; left at name only when that rename fails too (the next push then passes it by:
        make_tmp's `kept`)."""
        reason = f"stood at {dst}; not put back there: {why}"
        try:
            kept = self.quarantine(name, reason)
        except OSError as e:
            if self._root().lstat(name) is not None:
                kept = self._keep_beside(name, dst)
            else:  # moved into quarantine/ before its reason.txt failed (or an NFS rename back did happen)
                kept = f"{self.show('quarantine')}/ or {self.show(dst)} (moved; then {e.strerror or e})"
        return LeftAside(errno.EEXIST, f"{self.show(dst)}: what stood there is kept at {kept} ({why})")

    def _keep_beside(self, name: str, dst: str) -> str:
        """Rename `name` to a fresh kept_name beside dst (never over anything): where it is now, shown."""
        kept = kept_name(dst, self.tmp_tag, secrets.token_hex(4))
        with contextlib.suppress(OSError):
            root = self._root()
            if root.rename_new(name, kept):
                with contextlib.suppress(OSError):
                    os.fsync(root.fd)
                return self.show(kept)
        return self.show(name)


def _nothing_at(root: Dir, name: str) -> bool:
    """Whether `name` in root is missing or an empty directory (a rename claim's: dirfd's fallback on NFS)."""
    try:
        with Dir.at(root, name) as there:
            return not holds_any(there.fd)
    except FileNotFoundError:
        return True
    except OSError:
        return False
