"""What a sync gives back: its result (SyncResult) and the ways it fails (SyncError and its kinds).

Apart from sync.py so that each half of the Syncer (its copy up, daemon/jobs/sync_copy.py; its fetch) and whoever
reads an outcome (the sync worker, the tests) names them without importing the Syncer itself. Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass

from minilmd.names import REMOTE_OWNER


class SyncError(RuntimeError):
    """A sync or fetch failed; the message names the checkpoint, the remote and the cause. Retry later."""


class RemoteNotOurs(SyncError):
    """The remote's owner record (owner.json) is not this run's claim any more: replaced, renamed or made another
    run's since this run synced there. Nothing is written there; like a remote out of reach, retried (its owner may
    put it right), but said with its reason (daemon/jobs/syncworker.py); a finished run's last sync waits for it
    (SyncWorker.final_sync): never a run that ends, done or failed, with its last checkpoint unsynced."""

    what = "run.remote's owner record is no longer this run's"
    """What keeps the syncs out, in the words of the events and of `status`."""
    waits_for = f"run.remote's {REMOTE_OWNER} is this run's again or gone (removed by whoever owns it)"
    """What the syncs wait for."""


class RemoteOfAnotherRun(SyncError):
    """run.remote is another run's (remote_claim.Refusal.another_run: its claim names another run.dir, or it holds
    checkpoints and no claim and this run never synced there): nothing is written there, and no wait ends it (two
    runs started together on one run.remote each passed the launch's check; the loser's syncs were refused, and its
    last sync waited for ever for a claim whose removal made nothing its own). Final, as at the launch (exit 2): the
    supervisor stops the run, its checkpoints kept (daemon/jobs/syncworker.py final_refusal). The message is the
    refusal in a line (status, state.json); `detail` is the whole of it, every way on, for the log."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


class RemoteGone(RemoteNotOurs):
    """run.remote's root is gone, or is not the directory this run synced to (daemon/jobs/remote_root.py: a share
    unmounted, the directory replaced): nothing is made, written or deleted there; waited for as a refused claim."""

    what = "run.remote is not the directory this run synced to"
    waits_for = "run.remote is the directory this run synced to again (its share mounted)"


class ShareDead(RemoteGone):
    """run.remote's root answers one of mounts.DEAD_MOUNT_ERRNOS (a FUSE share whose daemon died: ENOTCONN; a stale
    NFS handle of the mount's: ESTALE): no access gets past it until the share is mounted again, and three tries in
    three seconds would end the run failed, its last checkpoint only in scratch. Waited for as a share gone."""

    what = "run.remote's share does not answer (its FUSE daemon gone, or a stale handle)"
    waits_for = "run.remote's share answers again (mounted again)"


class SyncAbandoned(SyncError):
    """The supervisor gave up on this sync (a Slurm job's end is near: daemon/slurm/lastsynccut.py): raised at the
    copy's next chunk, whose half copy is then removed as after any failed copy (`_copy_up`)."""


class FetchStopped(SyncError):
    """The supervisor stops while staging fetches (StagingWorker.stop): raised before the fetch's next read of a
    remote checkpoint, and at once from its pause before a read again, so that the staging thread ends in moments,
    not after the remote's every damaged step was read three times (daemon/jobs/fetch.py). Nothing is set aside."""


class RemoteFull(SyncError):
    """No room on the remote (ENOSPC, EDQUOT); `free`: bytes left there once the half copy went (None: unknown);
    `inodes`: the remote's inode count when none is left for a new file (what ran out: not bytes), else None;
    `needs`: the bytes the copy needs, when the raiser knows (a LoRA base's copy: its staged files), else None."""

    def __init__(self, message: str, free: int | None, inodes: int | None = None, needs: int | None = None):
        super().__init__(message)
        self.free, self.inodes, self.needs = free, inodes, needs


@dataclass
class SyncResult:
    step: int | None
    """Step of the newest checkpoint on the remote after this sync (None: nothing to sync, remote empty)."""
    path: str | None
    """Its remote path (URL for fsspec remotes)."""
    verified: bool
    """The remote copy was read back and matched its manifest (now, or when it was copied)."""
    copied: bool = False
    """False when the remote already held this step (or a newer one)."""
    bytes: int = 0
    """Bytes copied by this sync."""
    seconds: float = 0.0
    removed: tuple[str, ...] = ()
    """Remote checkpoints deleted by retention."""
