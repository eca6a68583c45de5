"""Pruning scratch under a supervisor: the SyncWorker's methods that decide which local checkpoints go (a mixin of
daemon/jobs/syncworker.py, whose module docstring states the rules), apart from the sync's timing and outcomes.

Only the supervisor knows what is synced and what is being synced, so it prunes (the trainer does not, under a
supervisor): after each verified sync, while the remote has been failing for a while, and whenever scratch has no
room for the next ROOM_FOR checkpoints (`make_room`); never the checkpoint a running sync is copying, never the
newest valid one. Torch-free.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minilmd import names
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base.runstate import RunState, now
from minilmd.daemon.base.worker import Worker
from minilmd.daemon.jobs.checkpoint_room import checkpoint_bytes, free_bytes
from minilmd.fmt import fmt_mb as mb

if TYPE_CHECKING:
    from minilmd.daemon.jobs.sync import Syncer

ROOM_FOR = 2
"""Scratch is kept with room for this many more checkpoints (the next save, and one more while a sync holds an
older one): below it, superseded checkpoints are pruned."""


class ScratchPruning:
    """What SyncWorker prunes in scratch, and when (a mixin: the SyncWorker's own state)."""

    cfg: Any
    infra: Any
    state: RunState
    syncer: Syncer | None
    worker: Worker | None
    copying: Path | None
    failures: int
    failing_since: float | None
    healthy_since: float
    prune_unsynced_after_s: float
    _sizes: dict[str, int | None]
    emit: Callable[..., None]

    if TYPE_CHECKING:  # the SyncWorker's own
        @property
        def enabled(self) -> bool: ...

        def running_for(self) -> float: ...

        def _start(self, why: str) -> None: ...

    def newest_size(self) -> int | None:
        """Bytes of the newest local checkpoint: what the next save will need, about."""
        steps = local_checkpoint_steps(self.cfg.checkpoint_dir)
        return self._size(names.step_name(steps[-1])) if steps else None

    def make_room(self, needs: int | None = None) -> int | None:
        """Keep scratch with `needs` bytes free (default: room for ROOM_FOR checkpoints the size of the newest):
        below it, prune the oldest checkpoints, synced or not, until there is room (the newest valid one and the
        one being synced stay), and sync early. Returns the bytes free after, None if they cannot be measured."""
        root = self.cfg.checkpoint_dir
        free = free_bytes(root)
        steps = local_checkpoint_steps(root)
        size = self._size(names.step_name(steps[-1])) if steps else None
        if needs is None:
            needs = ROOM_FOR * size if size else None
        if free is None or needs is None or free >= needs:
            return free
        keep, freed = len(steps), 0
        for step in steps[:-1]:  # oldest first; what the newest supersedes
            if free + freed >= needs:
                break
            freed += self._size(names.step_name(step)) or 0
            keep -= 1
        if keep < len(steps):
            self._prune(protect=[], keep=keep,
                        why=f"scratch has {mb(free)} free, no room for the next checkpoints ({mb(needs)} needed): "
                            f"the oldest go, synced or not; the newest and the one being synced stay")
            free = free_bytes(root)
        self._sync_early()
        return free

    def _size(self, name: str) -> int | None:
        if self._sizes.get(name) is None:
            self._sizes[name] = checkpoint_bytes(self.cfg.checkpoint_dir / name)
        return self._sizes[name]

    def _sync_early(self) -> None:
        """Scratch is short of room: the newest checkpoint goes to the remote now rather than at sync.every (not
        while the remote is failing: its retry timing stands)."""
        if not self.enabled or self.syncer is None or self.worker is not None or self.failures:
            return
        newest = max(local_checkpoint_steps(self.cfg.checkpoint_dir), default=None)
        remote = self._remote_step()
        if newest is not None and (remote is None or newest > remote):
            self._start("scratch is short of room: early sync")

    def _remote_step(self) -> int | None:
        return self.state.remote_checkpoint.step if self.state.remote_checkpoint is not None else None

    def _being_copied(self) -> list[Path]:
        paths = [self.copying] if self.copying is not None else []
        current = getattr(self.syncer, "copying", None)  # what the Syncer took (it may skip an invalid newest)
        if self.worker is not None and current is not None:
            paths.append(Path(current))
        return paths

    def _prune_if_remote_down(self) -> None:
        patience = max(2 * self.cfg.sync.every_s, self.prune_unsynced_after_s)
        if now() - self.healthy_since < patience:  # a verified sync lately (each failed try is short on a dead NFS)
            return
        if len(local_checkpoint_steps(self.cfg.checkpoint_dir)) <= self.cfg.train.keep_local + 1:
            return
        self._prune(protect=[], why=f"{self._unsynced_for()}: only the newest {self.cfg.train.keep_local} stay, so "
                                    f"that scratch does not fill up")

    def _unsynced_for(self) -> str:
        """How long no sync has been verified, and why, as it is: failing syncs, one running that long, or none
        failed (nothing newer than the remote's step to sync, or none due yet)."""
        unsynced = f"no verified sync for {now() - self.healthy_since:.0f}s"
        if self.worker is not None:
            return f"{unsynced}: the sync running for {self.running_for():.0f}s has not finished"
        if self.failures and self.failing_since is not None:
            return (f"{unsynced}: the remote has been failing for {now() - self.failing_since:.0f}s ({self.failures} "
                    f"syncs in a row failed: {self.state.sync.error})")
        remote = self._remote_step()
        newest = max(local_checkpoint_steps(self.cfg.checkpoint_dir), default=None)
        why = f"nothing here is newer than the remote's step {remote}" if remote is not None and \
            (newest is None or newest <= remote) else "none was due"
        return f"{unsynced}, though no sync has failed ({why}; sync: {self.state.sync.state})"

    def _prune(self, protect: list[Path], why: str, keep: int | None = None) -> None:
        root = self.cfg.checkpoint_dir
        keep = self.cfg.train.keep_local if keep is None else keep
        try:
            deleted = self.infra.prune_local(root, keep, protect + self._being_copied(),
                                             lambda msg: self.emit("prune", msg))
        except Exception as e:  # noqa: BLE001 - pruning is housekeeping; never fatal
            self.emit("prune", f"local pruning failed: {type(e).__name__}: {e}")
            return
        if deleted:
            self.emit("prune", f"pruned local checkpoints {[p.name for p in deleted]} ({why})")
