"""The copy up of one checkpoint: the sync's steps 3 and 4 (daemon/jobs/sync.py's protocol).

A local checkpoint is copied to `<remote>/.tmp-step-XXXXXXXX-<host>-<pid>-<ticks>-boot<tag>/` (a fresh name where
another's entry or a link stands there), manifest last, read back and checked against its manifest, then renamed to
`step-XXXXXXXX` (where the store has no rename, written in place, its manifest last); a damaged earlier copy by that
name is set aside, and a half copy is never left behind. These are the `Syncer`'s own methods, kept here as a mixin,
as its fetch half is (daemon/jobs/fetch.py), so that the copy reads apart from when and what to sync. Torch-free.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minilmd import checkpoint as ck
from minilmd.daemon.base.worker import ReadWatch
from minilmd.daemon.jobs import sync_pass
from minilmd.daemon.jobs.remote_store import RemoteStore, Scan
from minilmd.daemon.jobs.sync_errors import SyncError
from minilmd.names import MANIFEST, MANIFEST_MAX_BYTES
from minilmd.proc_info import this_maker
from minilmd.tmpnames import sync_tmp_name
from minilmd.untrusted import Unreadable, loads, read_bytes


class CopyUp:
    """Local -> remote, one checkpoint: the `Syncer`'s copy methods (a mixin; `Syncer.sync_newest` calls them)."""

    remote_url: str
    expected: ck.Expectation | None
    log: Callable[[str], None]
    watch: ReadWatch
    copying: Path | None

    if TYPE_CHECKING:  # the Syncer's (daemon/jobs/sync.py)
        @property
        def remote(self) -> RemoteStore: ...

        def _once(self, key: tuple[str, str], msg: str) -> None: ...

        def _go_on(self) -> None: ...

    def _copy_up(self, local: Path, scan: Scan, replacing: bool = False) -> int:
        """Copy a local checkpoint to the remote and verify it there; the bytes copied. Once verified, it is in
        `scan` as intact, with the manifest the check read (a local remote) or the one written (elsewhere).
        `replacing`: the copy takes the place of the remote's step 0 of a stopped reference pass behind it
        (sync_pass.py; a store that renames into place only)."""
        remote = self.remote
        manifest, manifest_text = _local_manifest(local)
        name = local.name
        if remote.renames_into_place:
            target = sync_tmp_name(name, *this_maker())
        else:
            target = name  # no rename on this store: the manifest, written last, makes it exist
        # an earlier try's removed; another's entry or a link there is left, and the copy made under a fresh name
        target = remote.make_tmp(target, taken=lambda found, fresh: self._once(
            ("taken", target), f"sync: {found}; copying under {remote.show(fresh)} instead (a fresh name each time "
                               f"it is still there)"))
        size = sum(int(entry["size"]) for entry in manifest["files"].values())
        try:
            self.watch.reading(f"copying {name} to {remote.show(target)}", size)
            nbytes = sum(remote.put(local / f, target, f) for f in manifest["files"])
            self.watch.reading(f"reading back {name} at {remote.show(target)}", size)
            problems = ck.verify_manifest(manifest, lambda f: remote.size(target, f), remote.hasher(target, manifest))
            if problems:
                raise SyncError(f"remote copy of {name} at {remote.show(target)} does not match its manifest: "
                                + "; ".join(problems[:3]))
            nbytes += remote.put(local / MANIFEST, target, MANIFEST)
            if remote.read_text(target, MANIFEST) != manifest_text:  # the one the copy was verified against
                raise SyncError(f"remote {MANIFEST} of {name} at {remote.show(target)} reads back differently")
            self.watch.reading(f"putting {name} in place on {self.remote_url}")
            self._go_on()  # abandoned after its last chunk: the verified copy is removed, not put in place
        except BaseException:
            with contextlib.suppress(OSError):  # the copy's own error is the one raised
                remote.rm(target)  # this sync's half copy (a full remote, EIO): never left behind
            raise
        if replacing:  # in place of the remote's stopped reference pass, while it is still behind this copy
            if not sync_pass.publish_further(remote, target, manifest):
                with contextlib.suppress(OSError):
                    remote.rm(target)  # this sync's verified copy, which has nowhere to go
                raise SyncError(f"{remote.show(name)} changed while a further reference pass was copied: left as "
                                f"it is")
        elif remote.renames_into_place and name in remote.names():  # a damaged earlier copy: set it aside
            try:
                self._clear_for_copy(name)
            except BaseException:
                with contextlib.suppress(OSError):
                    remote.rm(target)  # this sync's verified copy, which has nowhere to go
                raise
        if remote.renames_into_place:
            if not replacing:
                remote.rename_dir(target, name)
                self.watch.answer()
            # A filesystem may acknowledge the rename without doing it (a flaky NFS server). The client's caches can
            # still answer for the new name (FUSE and NFS cache attributes and pages), so ask the listing first.
            if name not in remote.names():
                problems = [f"{name} is not in the listing of {remote.url}"]
            else:
                manifest, problems = remote.intact(name)  # what retention then judges it by
            if problems:
                raise SyncError(f"rename of {remote.show(target)} to {name} did not take effect: "
                                + "; ".join(problems[:3]))
        scan[name] = (manifest, [])
        return nbytes

    def _clear_for_copy(self, name: str) -> None:
        """Make way for a verified copy of `name`: a leftover without a manifest removed, a damaged copy quarantined;
        only this user's real directories (remote_write.py): another's entry is never removed, moved nor written
        into, and the copy fails saying what is there."""
        remote = self.remote
        try:
            if remote.manifest(name) is None:
                if why := remote.rm(name):
                    raise SyncError(f"{remote.show(name)} is {why}: not this run's, left as it is; {name} not copied")
            else:
                dest = remote.set_aside(name, "damaged; replaced by a verified copy during sync")
                self.log(f"sync: damaged remote {remote.show(name)} quarantined to {dest}, replaced by a verified "
                         f"copy")
        except OSError as e:
            raise SyncError(f"cannot make way for the copy of {name}: {e}") from e

    def _copy_valid(self, local: Path, scan: Scan, not_copied: str, replacing: bool = False) -> int | None:
        """_copy_up of a checkpoint besides the newest, once it validates: the bytes copied; None when it does not
        validate, said after `not_copied` (the caller's words for it)."""
        try:
            ck.validate(local, self.expected)
        except ck.CheckpointError as e:
            self.log(f"{not_copied}: {'; '.join(e.problems[:3])}")
            return None
        self.copying = local
        return self._copy_up(local, scan, replacing=replacing)


def _local_manifest(local: Path) -> tuple[Any, str]:
    """(the manifest of a local checkpoint, its text), read once as untrusted (no link, bounded in size and depth):
    the one reading the remote copy is verified against and its manifest compared with (it was parsed by path, then
    read again for the comparison). SyncError when it is no manifest now (changed since it validated)."""
    path = local / MANIFEST
    try:
        raw = read_bytes(path, max_bytes=MANIFEST_MAX_BYTES)
        manifest = loads(raw, path=path)
    except Unreadable as e:
        raise SyncError(f"cannot read {path}: {e.why}") from None
    problems = ck.manifest_problems(manifest)
    if problems:
        raise SyncError(f"{path}: {'; '.join(problems[:3])}")
    return manifest, raw.decode("utf-8")
