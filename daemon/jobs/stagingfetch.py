"""The staging's fetch of a remote checkpoint: the newest valid one when scratch holds none, a newer one than
scratch's (daemon/jobs/scratch_behind.py), and the wait, with backoff, while the remote cannot be read.

These are the `StagingWorker`'s own methods (daemon/jobs/stagingworker.py), kept here as a mixin: the fetch's rule
(never start from step 0, nor from scratch's older step, while the remote may hold a newer one; `run --fresh` aside,
daemon/jobs/remotewait.py) reads apart from the corpus copy and the staging phase's ticks. `_fetch_job` runs in the
staging thread; the others in the loop. Torch-free.
"""
from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minilmd.bounded import bounded_probe
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base.runstate import RunState, now
from minilmd.daemon.child.policy import backoff_seconds
from minilmd.daemon.jobs import keptcopy, remotewait
from minilmd.daemon.jobs.sync_errors import FetchStopped
from minilmd.names import step_of
from minilmd.run_states import REMOTE_UNAVAILABLE, StagingState, SyncState

NONE_VALID_WORDS = "remote answers, no checkpoint there verifies"
"""What a wait for a valid remote checkpoint begins with (sync `none_valid`), the remote answering: not "remote
unavailable", which it is not; remotewait.decision's words follow (how many were set aside, the step the run's
records say it synced there)."""


RELIST_AFTER_S = 5.0
"""A fetch into an empty scratch that found only older steps than the run's records say it synced there, none set
aside (a listing an NFS client cached, a share's replica behind), lists the remote again after this pause before it
resumes from the older step: a newer step listed then is fetched instead. A stop ends the pause at once."""


class StagingFetch:
    """The fetch of a remote checkpoint during staging (a mixin of StagingWorker, whose __init__ sets and documents
    each attribute below)."""

    cfg: Any
    infra: Any
    state: RunState
    emit: Callable[..., None]
    inbox: Any
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
    fetched_step: int | None = None
    """The step a fetch of this start put in scratch, though the staging may not have ended (a stop during the
    re-list): with no trainer run since, the last sync has nothing new to push (daemon/jobs/lastsyncrule.py)."""
    rewound: bool = False
    """A fetch of this start resumes from an older step than the remote held, saying so (`set_aside`'s notes: its
    newer steps set aside as invalid, or gone, their steps trained again): the last sync may push an older step
    than state.json records, the remote's newer one being lost (daemon/jobs/lastsyncrule.py)."""
    first_listed: int | None = None
    """The newest step the remote's first listing held, when `_list_again` listed it again."""
    remote_newer: int | None
    before_look: tuple[str, str | None, float | None] | None = None
    """The sync section (state, error, since) before say_remote marked run.remote unavailable, put back when it
    answers again."""
    remote_look: str = ""
    """look_at_remote's words of the last staging try the corpus source did not answer (set by the thread)."""
    fetch_full: bool
    none_valid: bool
    awaiting_remote: Path | None
    fetch_failures: int
    fetch_retry_at: float
    fetch_started: float
    stop_fetch: threading.Event

    def _remote_unavailable(self, staged: Path, error: str) -> None:
        """Scratch holds no checkpoint, or an older one than the remote's (`remote_newer`), and the remote could not
        be read (or scratch had no room for its step): never start from step 0 or scratch's older step; retry with
        backoff for as long as it takes (not the trainer's fault: no_progress_limit does not count it). Status shows
        "remote unavailable: ..." (or "no room in scratch: ...": `fetch_full`; NONE_VALID_WORDS and sync `none_valid`
        when the remote answers and none of its checkpoints verifies: `none_valid`), staging "waiting_remote"."""
        scratch_full, none_valid = self.fetch_full, self.none_valid
        self.awaiting_remote = staged
        self.fetch_failures += 1
        delay = backoff_seconds(self.cfg.restart, self.fetch_failures, self.rng)
        self.fetch_retry_at = now() + delay
        said = "no room in scratch" if scratch_full else NONE_VALID_WORDS if none_valid else REMOTE_UNAVAILABLE
        message = f"{said}: {error}"
        sync, staging = self.state.sync, self.state.staging
        if not scratch_full:
            sync.state = SyncState.NONE_VALID if none_valid else SyncState.UNAVAILABLE
            sync.error, sync.since = message, now()
        staging.state, staging.error = StagingState.WAITING_REMOTE, message
        self.state.record_error(message)
        fresh = " (`minilmd run --fresh` starts from step 0 instead)" if self.fetch_failures == 1 else ""
        why = "not going on from scratch's older step (its syncs would write a second history over the remote's)" \
            if self.remote_newer is not None else \
            f"scratch holds no checkpoint and the remote may hold one: not starting from step 0{fresh}"
        self.emit("fetch", f"{message}; {why}; fetch try {self.fetch_failures} failed, next in {delay:.1f}s")
        self.state.save()

    def look_at_remote(self) -> str:
        """In the staging thread, once the corpus source did not answer: the run's local run.remote looked at as
        `run --check` looks at it (remote_claim.root_words_now, bounded), so that a share gone with the corpus's is
        known while staging waits, not only at the next sync. Its words when it is gone, replaced or does not answer
        within the bound; "" when it answers as the run's root (or is no local path, or the run never recorded it)."""
        from minilmd.daemon.jobs import remote_claim
        from minilmd.urls import local_remote_root

        if not self.cfg.run.remote or local_remote_root(self.cfg.run.remote) is None:
            return ""
        # keyed: a retry while the last look is still stuck starts no other (one thread left behind, not one a try)
        answered, words = remote_claim.root_words_now(self.cfg, self.fresh, key=("staging looks at",
                                                      self.cfg.run.remote))
        return words if answered else f"{self.cfg.run.remote} does not answer (a share that stalls?)"

    def say_remote(self, words: str) -> None:
        """In the loop: what look_at_remote found, in state.json's sync section (sync `unavailable`, its error
        REMOTE_UNAVAILABLE's words), which status says beside the last verified sync ("run.remote does not answer
        now"); the sync section as it was before, once the remote answers again (or the wait is over)."""
        sync = self.state.sync
        if words:
            if sync.state != SyncState.UNAVAILABLE:
                self.before_look = (sync.state, sync.error, sync.since)
                sync.state, sync.since = SyncState.UNAVAILABLE, now()
                self.emit("staging", f"{REMOTE_UNAVAILABLE}: {words} (looked at while staging waits for the corpus)")
            sync.error = f"{REMOTE_UNAVAILABLE}: {words}"
        elif self.before_look is not None:
            if sync.state == SyncState.UNAVAILABLE:  # still what the look set: the remote answers again
                sync.state, sync.error, sync.since = self.before_look
            self.before_look = None

    def _flag_stalled_fetch(self) -> None:
        started = self.fetch_started
        if started and now() - started > self.stalled_after_s and \
                self.state.sync.state != SyncState.UNAVAILABLE:
            message = f"{REMOTE_UNAVAILABLE}: fetching from {self.cfg.run.remote} has been running for " \
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
        self.none_valid, self.first_listed = False, None
        synced = self.state.remote_checkpoint.step if self.state.remote_checkpoint is not None else None
        for said in (keptcopy.drop_if_synced(self.cfg, synced), keptcopy.bring_back(self.cfg, expected)):
            if said:  # an earlier job's unsynced newest, kept in run.dir: synced since, or resumed (both may be said:
                self.emit("fetch", said)  # a damaged copy set aside removed, a newer one kept brought back)
        if local_checkpoint_steps(self.cfg.checkpoint_dir):  # the remote's only when scratch is behind it
            try:
                verdict = scratch_behind.fetch_over_scratch(self._syncer(expected), self.cfg.checkpoint_dir,
                                                            expected, self.remote_newer)
            finally:
                self.fetch_started = 0.0
            if verdict.wait:  # retried (`_remote_unavailable`), scratch's older step never resumed meanwhile
                self.remote_newer, self.fetch_full = verdict.newer, verdict.scratch_full
                return expected, None, verdict.wait
            taken, self.unlooked, self.set_aside, self.remote_newer = verdict.taken, verdict.unlooked, \
                verdict.set_aside, None
            self.rewound = self.rewound or bool(self.set_aside)
            self.fetched_why = taken.words() if taken else ""
            self.fetched_step = taken.step if taken else self.fetched_step
            return expected, self.cfg.checkpoint_dir / taken.name if taken else None, None
        self.state.staging.progress = f"fetching the newest checkpoint from {self.cfg.run.remote}"
        self.from_step_0, self.remote_newer = "", None  # scratch emptied meanwhile: no step of its to wait over
        try:
            syncer = self._syncer(expected)
            fetched = syncer.fetch_latest(self.cfg.checkpoint_dir)
            self.fetch_set_aside += tuple(syncer.fetch_set_aside)
            self.fetched_step = step_of(fetched) if fetched is not None else self.fetched_step
            if fetched is None:  # a look at the remote's root: a stalled mount shows as a stalled fetch too
                return expected, None, self._nothing_fetched()
            listed_again = not syncer.fetch_set_aside and self._behind_records(step_of(fetched))
            if listed_again:
                fetched = self._list_again(syncer, fetched)
            self.set_aside = self._older_than_synced(step_of(fetched), tuple(syncer.fetch_set_aside), listed_again)
            self.rewound = self.rewound or bool(self.set_aside)
        except CheckpointMismatch:
            raise
        except FetchStopped as e:  # the supervisor stops: no step 0 chosen, `--fresh` or not
            return expected, None, str(e)
        except Exception as e:  # noqa: BLE001 - an unreachable/failing remote: retried by the loop
            if not self.fresh:
                return expected, None, f"{type(e).__name__}: {e}"
            self.from_step_0 = f"{self.cfg.run.remote} cannot be read ({type(e).__name__}: {e}), and `--fresh` " \
                               f"was given"
            return expected, None, None
        finally:
            self.fetch_started = 0.0
        return expected, fetched, None

    def _syncer(self, expected):
        """The Syncer a fetch reads the remote with, ended by a stop (`stop_fetch`: its reads again wake at once)."""
        syncer = self.syncer_for(expected)
        syncer.fetch_stop = self.stop_fetch
        return syncer

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
            self.none_valid = not absent  # it answers: its checkpoints are what is lost, not the remote
            return why
        self.from_step_0 = why
        return None

    def _records(self) -> remotewait.Records:
        """What the run's records say of its remote, read once per staging."""
        if self.records is None:
            self.records = remotewait.records(self.cfg.run.remote, self.cfg.run_dir, self.state.remote_checkpoint,
                                              self.state.previous_unreadable)
        return self.records

    def _behind_records(self, step: int) -> bool:
        """Whether the run's records say it synced a newer step than `step` to the remote."""
        recorded = self._records().step
        return recorded is not None and recorded > step

    def _list_again(self, syncer, fetched: Path) -> Path:
        """The remote listed only older steps than the run's records say it synced there, and none was set aside:
        listed again after RELIST_AFTER_S (a stale listing passes), and a newer step listed now fetched instead;
        else `fetched`. FetchStopped when a stop ends the pause."""
        self.inbox.put(f"fetch: run.remote {self.cfg.run.remote} lists no step newer than {step_of(fetched)}, "
                       f"though the run's records say step {self._records().step} was synced there: listing it "
                       f"again in {RELIST_AFTER_S:g}s before resuming from the older step")  # from the thread
        if self.stop_fetch.wait(RELIST_AFTER_S):
            raise FetchStopped(f"fetch from {self.cfg.run.remote} stopped: the supervisor stops")
        self.first_listed = step_of(fetched)
        listed = syncer.listed()
        if not listed or step_of(listed[-1]) <= step_of(fetched):
            return fetched
        again = syncer.fetch_latest(self.cfg.checkpoint_dir)
        self.fetch_set_aside += tuple(syncer.fetch_set_aside)  # what it set aside counts as the first fetch's does
        self.fetched_step = step_of(again) if again is not None else self.fetched_step
        return again or fetched

    def _older_than_synced(self, step: int, newer: tuple[str, ...], listed_again: bool = False) -> tuple[str, ...]:
        """The note for a fetch that set `newer` checkpoints aside as invalid and took an older one (their steps are
        trained again), with the step the run's records say it synced there; for one that took an older step than
        those records say though it set none aside (`listed_again`: the remote listed again, the same), which steps
        are trained again; () otherwise."""
        found = self._records()
        recorded = found.step
        if not newer:
            if not listed_again or recorded is None or recorded <= step:
                return ()
            first = self.first_listed
            newer_now = first is not None and first < step  # the second listing held a newer step, still behind
            again = f"its newest was step {step}, still older" if newer_now else \
                "the same (steps removed there, or a listing that stays stale)"
            return (f"run.remote {self.cfg.run.remote} listed no step newer than {first if newer_now else step}, "
                    f"though the run's records say step {recorded} was synced there ({found.why}), and listed "
                    f"again after {RELIST_AFTER_S:g}s {again}: resuming from step {step}, which verifies: steps "
                    f"{step + 1}-{recorded} are trained again",)
        behind = f"; the run's records say step {recorded} was synced there ({found.why}): steps " \
                 f"{step + 1}-{recorded} are trained again" if recorded is not None and recorded > step else ""
        return (f"run.remote {self.cfg.run.remote}: {len(newer)} newer checkpoint(s) did not verify at any read "
                f"and were set aside ({'; '.join(newer[:4])}): resuming from the older step {step}, which "
                f"verifies{behind}",)
