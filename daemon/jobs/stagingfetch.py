"""The staging's fetch of a remote checkpoint: the newest valid one when scratch holds none, a newer one than
scratch's (daemon/jobs/scratch_behind.py), and the wait, with backoff, while the remote cannot be read.

These are the `StagingWorker`'s own methods (daemon/jobs/stagingworker.py), kept here as a mixin: the fetch's rule
(never start from step 0, nor from scratch's older step, while the remote may hold a newer one; `run --fresh` aside,
daemon/jobs/remotewait.py) reads apart from the corpus copy and the staging phase's ticks. `_fetch_job` runs in the
staging thread; the others in the loop. Torch-free.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minilmd.bounded import bounded_probe
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base.runstate import RunState, now
from minilmd.daemon.child.policy import backoff_seconds
from minilmd.daemon.jobs import keptcopy, remotewait
from minilmd.names import step_of
from minilmd.run_states import StagingState, SyncState


class StagingFetch:
    """The fetch of a remote checkpoint during staging (a mixin of StagingWorker, whose __init__ sets and documents
    each attribute below)."""

    cfg: Any
    infra: Any
    state: RunState
    emit: Callable[..., None]
    syncer_for: Callable[[Any], Any]
    rng: random.Random
    fresh: bool
    stalled_after_s: float
    records: remotewait.Records | None
    from_step_0: str
    fetched_why: str
    unlooked: str
    set_aside: tuple[str, ...]
    fetch_set_aside: tuple[str, ...] = ()
    remote_newer: int | None
    fetch_full: bool
    awaiting_remote: Path | None
    fetch_failures: int
    fetch_retry_at: float
    fetch_started: float

    def _remote_unavailable(self, staged: Path, error: str) -> None:
        """Scratch holds no checkpoint, or an older one than the remote's (`remote_newer`), and the remote could not
        be read (or scratch had no room for its step): never start from step 0 or scratch's older step; retry with
        backoff for as long as it takes (not the trainer's fault: no_progress_limit does not count it). Status shows
        "remote unavailable: ..." (or "no room in scratch: ...": `fetch_full`), staging "waiting_remote"."""
        scratch_full = self.fetch_full
        self.awaiting_remote = staged
        self.fetch_failures += 1
        delay = backoff_seconds(self.cfg.restart, self.fetch_failures, self.rng)
        self.fetch_retry_at = now() + delay
        message = f"{'no room in scratch' if scratch_full else 'remote unavailable'}: {error}"
        sync, staging = self.state.sync, self.state.staging
        if not scratch_full:
            sync.state, sync.error, sync.since = SyncState.UNAVAILABLE, message, now()
        staging.state, staging.error = StagingState.WAITING_REMOTE, message
        self.state.record_error(message)
        fresh = " (`minilmd run --fresh` starts from step 0 instead)" if self.fetch_failures == 1 else ""
        why = "not going on from scratch's older step (its syncs would write a second history over the remote's)" \
            if self.remote_newer is not None else \
            f"scratch holds no checkpoint and the remote may hold one: not starting from step 0{fresh}"
        self.emit("fetch", f"{message}; {why}; fetch try {self.fetch_failures} failed, next in {delay:.1f}s")
        self.state.save()

    def _flag_stalled_fetch(self) -> None:
        started = self.fetch_started
        if started and now() - started > self.stalled_after_s and \
                self.state.sync.state != SyncState.UNAVAILABLE:
            message = f"remote unavailable: fetching from {self.cfg.run.remote} has been running for " \
                      f"{now() - started:.0f}s"
            sync = self.state.sync
            sync.state, sync.error, sync.since = SyncState.UNAVAILABLE, message, now()
            self.emit("fetch", f"{message}; waiting for it (not starting from step 0)")

    def _fetch_job(self, staged: Path):
        """(expectation, fetched path or None, fetch error text or None). A checkpoint of another model or corpus
        on the remote raises (final); any other failure to read the remote is returned, to be retried."""
        if not self.cfg.run.remote:
            return None, None, None
        from minilmd.checkpoint import CheckpointMismatch  # numpy: only where a checkpoint is read
        from minilmd.daemon.jobs import scratch_behind

        expected = self.infra.expectation(self.cfg, staged)
        self.fetch_started, self.fetched_why, self.unlooked, self.set_aside, self.fetch_full = now(), "", "", (), False
        synced = self.state.remote_checkpoint.step if self.state.remote_checkpoint is not None else None
        if said := keptcopy.drop_if_synced(self.cfg, synced) or keptcopy.bring_back(self.cfg, expected):
            self.emit("fetch", said)  # an earlier job's unsynced newest, kept in run.dir: synced since, or resumed
        if local_checkpoint_steps(self.cfg.checkpoint_dir):  # the remote's only when scratch is behind it
            try:
                verdict = scratch_behind.fetch_over_scratch(self.syncer_for(expected), self.cfg.checkpoint_dir,
                                                            expected, self.remote_newer)
            finally:
                self.fetch_started = 0.0
            if verdict.wait:  # retried (`_remote_unavailable`), scratch's older step never resumed meanwhile
                self.remote_newer, self.fetch_full = verdict.newer, verdict.scratch_full
                return expected, None, verdict.wait
            taken, self.unlooked, self.set_aside, self.remote_newer = verdict.taken, verdict.unlooked, \
                verdict.set_aside, None
            self.fetched_why = taken.words() if taken else ""
            return expected, self.cfg.checkpoint_dir / taken.name if taken else None, None
        self.state.staging.progress = f"fetching the newest checkpoint from {self.cfg.run.remote}"
        self.from_step_0, self.remote_newer = "", None  # scratch emptied meanwhile: no step of its to wait over
        try:
            syncer = self.syncer_for(expected)
            fetched = syncer.fetch_latest(self.cfg.checkpoint_dir)
            self.fetch_set_aside += tuple(syncer.fetch_set_aside)
            if fetched is None:  # a look at the remote's root: a stalled mount shows as a stalled fetch too
                return expected, None, self._nothing_fetched()
            self.set_aside = self._older_than_synced(step_of(fetched), tuple(syncer.fetch_set_aside))
        except CheckpointMismatch:
            raise
        except Exception as e:  # noqa: BLE001 - an unreachable/failing remote: retried by the loop
            if not self.fresh:
                return expected, None, f"{type(e).__name__}: {e}"
            self.from_step_0 = f"{self.cfg.run.remote} cannot be read ({type(e).__name__}: {e}), and `--fresh` " \
                               f"was given"
            return expected, None, None
        finally:
            self.fetch_started = 0.0
        return expected, fetched, None

    def _nothing_fetched(self) -> str | None:
        """The remote lists no checkpoint that verifies: why the fetch must wait, when the remote is absent, or its
        checkpoints were set aside or are gone, and the run synced there before (daemon/jobs/remotewait.py); else
        None, and `from_step_0` says why the run starts from step 0."""
        remote = self.cfg.run.remote
        absent = remotewait.remote_absent(remote)
        if self.records is None:
            self.records = remotewait.records(remote, self.cfg.run_dir, self.state.remote_checkpoint,
                                              self.state.previous_unreadable)
        found = self.records
        # bounded as `run --check` bounds it: a mount that stalls the look answers "" (no first sync's words), no hang
        new = (bounded_probe(remotewait.made_by_first_sync, remote)[1] or "") if absent else ""
        wait, why = remotewait.decision(remote, absent, found, self.fresh, new, self.fetch_set_aside)
        if wait:
            return why
        self.from_step_0 = why
        return None

    def _older_than_synced(self, step: int, newer: tuple[str, ...]) -> tuple[str, ...]:
        """The note for a fetch that set `newer` checkpoints aside as invalid and took an older one (their steps are
        trained again), with the step the run's records say it synced there; () when it set none aside."""
        if not newer:
            return ()
        if self.records is None:
            self.records = remotewait.records(self.cfg.run.remote, self.cfg.run_dir, self.state.remote_checkpoint,
                                              self.state.previous_unreadable)
        recorded = self.records.step
        behind = f"; the run's records say step {recorded} was synced there ({self.records.why}): steps " \
                 f"{step + 1}-{recorded} are trained again" if recorded is not None and recorded > step else ""
        return (f"run.remote {self.cfg.run.remote}: {len(newer)} newer checkpoint(s) did not verify at any read "
                f"and were set aside ({'; '.join(newer[:4])}): resuming from the older step {step}, which "
                f"verifies{behind}",)
