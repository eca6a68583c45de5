"""The supervisor's side of staging: the corpus copy into scratch and, with a remote and an empty scratch, the fetch
of the newest valid remote checkpoint (or of a newer one than scratch's: daemon/jobs/scratch_behind.py), in a thread
the loop polls; the fetch retried, with backoff, for as long as the remote cannot be read (scratch empty, or behind
a newer remote step).

The copy and the fetch themselves are daemon/jobs/staging.py and daemon/jobs/sync.py (blocking; a stalled NFS may
hold them for minutes); the fetch's side of this worker (when to fetch, the wait for the remote) is
daemon/jobs/stagingfetch.py. `StagingWorker.tick()` is called by the loop in the staging phase and answers None
while the work goes on, `Staged` once the trainer may start, or `StagingFailed`; what a failure means for the run
(backoff, give up) is the supervisor's. A remote that cannot be read while scratch holds no checkpoint is not a
failure: the remote may hold a newer checkpoint, so the run never silently starts from step 0; the worker keeps
retrying the fetch and shows "remote unavailable" in status. So is a remote that lists nothing because it is out of
reach (not there, an empty mount point, a link to nowhere) when the run has synced before, unless `run --fresh`
(daemon/jobs/remotewait.py). A source whose reads block (a stalled mount: no error, no answer) for longer than
MINILMD_SYNC_STALLED_AFTER, while the corpus, the probe or init.from (or a LoRA base's copy on the remote) is
staged, is shown as stalled (state.json "staging.stalled": "<what> not answering since T (stalled)") until a read of
it returns. Torch-free.
"""
from __future__ import annotations

import functools
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minilmd import names, protocol, scratch, scratch_hold, scratch_remade
from minilmd.batch_stream import change_note, newest_recorded, stream_changes
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base import timeline
from minilmd.daemon.base.knobs import SYNC_STALLED_AFTER
from minilmd.daemon.base.runstate import RunState, now
from minilmd.daemon.base.statesections import LocalCheckpoint, StagingStall
from minilmd.daemon.base.worker import Inbox, ReadWatch, Worker
from minilmd.daemon.child.policy import backoff_seconds
from minilmd.daemon.jobs import initstage, remotewait, scratch_removed
from minilmd.daemon.jobs.stageinputs import base_from_remote as _base_from_remote
from minilmd.daemon.jobs.stageinputs import stage_inputs as _stage_inputs
from minilmd.daemon.jobs.staging_errors import ProbeUnreachable, ScratchFull, SourceUnreachable
from minilmd.daemon.jobs.stagingfetch import StagingFetch
from minilmd.fmt import not_answering
from minilmd.fsio import is_disk_full
from minilmd.names import step_of
from minilmd.roomwords import made_in, no_room, top_of
from minilmd.run_states import StagingState, SyncState

WAIT_OVER = {"corpus source unreachable": "corpus source reachable again",
             "probe source unreachable": "probe source reachable again",
             "init source unreachable": "init source reachable again", "no room in scratch": "room in scratch again"}
"""What `_wait_for` waits for -> the event that says the wait is over."""


@dataclass
class Staged:
    """The corpus is staged and verified, and scratch holds the newest checkpoint there is (or none exists)."""

    path: Path
    expected: object
    """The run's checkpoint Expectation (model config, corpus fingerprints) for the Syncer; None without a remote."""
    fetched: Path | None
    """The checkpoint fetched from the remote into scratch, if one was."""


@dataclass
class StagingFailed:
    error: str
    exit_status: int | None
    """Final (retrying cannot help): the supervisor's exit status; None when a retry after a backoff may help."""


class StagingWorker(StagingFetch):
    """Owns the staging/fetch thread and the fetch's retry timing. `state` is the run's RunState (its "staging"
    entry, and "sync" while the remote cannot be read, are written here), `emit(kind, message, **details)` logs an
    event, `inbox` takes the staging code's messages from its thread, `syncer_for(expected)` gives a Syncer."""

    def __init__(self, cfg, infra, state: RunState, emit, inbox: Inbox, syncer_for, rng: random.Random | None = None,
                 fresh: bool = False, stalled_after_s: float = SYNC_STALLED_AFTER.default_s):
        self.cfg = cfg
        self.stalled_after_s = stalled_after_s
        """A fetch or a source read running longer than this is stalled (daemon/base/knobs.py)."""
        self.fresh = fresh
        """`minilmd run --fresh`: with no checkpoint in scratch and a remote that cannot be read, start from step 0
        rather than wait for the remote (daemon/jobs/remotewait.py). For the first staging only: a later one (scratch
        lost its checkpoints while this supervisor ran) must not start this run's own lineage over."""
        self.records: remotewait.Records | None = None
        """What the run's records say of its remote, read once per staging (a fetch retried reads them no more)."""
        self.from_step_0 = ""
        """Why the last fetch leaves the trainer to start from step 0 (set by the thread; said once staged)."""
        self.fetched_why = ""
        """Why a checkpoint was fetched beside or over scratch's (daemon/jobs/scratch_behind.py; set by the thread)."""
        self.unlooked = ""
        """Why scratch's is resumed without the remote compared (scratch_behind.Verdict; set by the thread)."""
        self.set_aside: tuple[str, ...] = ()
        """Newer remote steps set aside as invalid when fetched over scratch's, or over what the run synced (set by the
        thread; said once)."""
        self.fetch_set_aside: tuple[str, ...] = ()
        """What this staging's fetches into an empty scratch set aside on the remote (remotewait.decision's words)."""
        self.remote_newer: int | None = None
        """The remote's step seen newer than scratch's whose fetch failed: retried, never given up for scratch's."""
        self.fetch_full = False  # that fetch failed on a scratch without room (set by the thread)
        self.none_valid = False
        """The last fetch's remote answered but holds no checkpoint that verifies, and the run waits for one (set by
        the thread): status says so (sync `none_valid`), not "remote unavailable"."""
        self.stop_fetch = threading.Event()
        """Set when the supervisor stops (`stop`): a running fetch ends before its next read of a remote checkpoint
        (daemon/jobs/fetch.py FetchStopped), its pause before a read again woken at once."""
        self.infra = infra
        self.state = state
        self.emit = emit
        self.inbox = inbox
        self.syncer_for = syncer_for
        self.rng = rng or random.Random()
        self.staged: Path | None = None
        """The verified staged corpus the trainer reads; None until staged and after `forget()`."""
        self.worker: Worker | None = None
        self.awaiting_remote: Path | None = None  # staged, but the remote could not be read for a resume: retrying
        self.fetch_failures = 0
        self.fetch_retry_at = 0.0
        self.fetch_started = 0.0  # set by the thread while it reads the remote
        self.inputs: dict[str, str] = {}
        """The `--set` overrides naming the staged probe and init.from (daemon/jobs/initstage.py) for the trainer."""
        self.ranks: Callable[[], int] | None = None
        """The ranks the trainer is launched with (the supervisor's: its leased cards, a Slurm job's nodes x cards),
        what a checkpoint's recorded world size is compared with; None: the config's (cfg.world_size)."""
        self.pending: Staged | None = None  # corpus staged (and fetched): the probe and init.from still to stage
        self.source_failures = 0
        self.source_retry_at = 0.0
        self.reads = ReadWatch()
        """What the staging thread reads on shared storage, and when a read last returned (a stall shows)."""
        self.claimed = False  # reclaim() has claimed scratch: one gone since was removed while the run ran
        self.removed: tuple[int | None] | None = None
        """Scratch was found removed at a reclaim: (the step its trainer had reached), said once staged again."""

    @property
    def running(self) -> bool:
        return self.worker is not None and not self.worker.done

    def inputs_for(self, slurm) -> dict[str, str]:
        """The `--set`s naming the staged probe and init.from, for this attempt's command. None in a Slurm job over
        several nodes: the other nodes' scratch holds only what daemon/slurm/node.py stages there (the corpus), so
        their trainers read the probe and init.from from their own paths, as before."""
        if slurm is not None and slurm.alloc.nnodes > 1:
            return {}
        return self.inputs

    def staged_copy_present(self) -> bool:
        """The staged corpus, and the staged probe and init.from this start reads, are still in scratch (a reboot
        or a cleaner may have emptied it)."""
        return self.staged is not None and (self.staged / names.CORPUS_META).is_file() and \
            initstage.present(self.cfg, self.inputs)

    def problems(self) -> list[str] | None:
        """What fails verification in the staged copy ([] when it verifies; unreadable counts as damaged), or None
        when nothing is staged."""
        if self.staged is None:
            return None
        try:
            return self.infra.verify_staged(self.staged) + initstage.problems(self.inputs)
        except OSError as e:
            return [f"{self.staged}: {e}"]

    def forget(self) -> None:
        """Stage again before the next launch (the staged copy is damaged or gone)."""
        self.staged, self.pending, self.inputs = None, None, {}

    def stop(self) -> None:
        """The supervisor stops: a fetch running or to come ends at its next read (the stopping phase waits
        STOP_WAITS_FOR_STAGING_S at most for this thread, daemon/ending.py: it ends well before)."""
        self.stop_fetch.set()

    def abandon(self) -> str:
        """Leave a thread stalled on the remote behind (its temp names are cleaned up next time); its name."""
        name = self.worker.name if self.worker is not None else ""
        self.worker = None
        return name

    # --- each tick in the staging phase ---------------------------------------------------------------------------
    def reclaim(self) -> str | None:
        """Claim scratch again (minilmd/scratch.py), before each staging, fetch and trainer start: None while it is
        still this run's own directory; else why not (a final config error: it was swapped, or can be)."""
        cfg = self.cfg
        gone = self.claimed and not os.path.lexists(cfg.scratch_dir)
        partly = self.claimed and scratch_remade.partly_removed(cfg.scratch_dir,
                                                                scratch.held_identity(cfg.scratch_dir))
        try:
            scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)
            scratch_hold.hold(cfg.scratch_dir)  # kept; moved to a scratch made anew (minilmd/scratch_hold.py)
        except scratch.ScratchChanged as e:  # a directory of the user's own there: what `rm -r` of it loses
            remote = self.state.remote_checkpoint
            return scratch_removed.changed(e, cfg.scratch_dir, remote.step if remote is not None else None)
        except scratch.ScratchRefused as e:
            return "; ".join(e.problems)
        except scratch_hold.ScratchInUse as e:
            return str(e)
        except OSError as e:
            return f"run.scratch {cfg.scratch_dir} cannot be claimed again: {e}"
        self.claimed = True
        if gone or partly:  # partly: the claim marked it again; what is left in it is this run's (fault11 F1)
            self.removed = (self.state.progress.step,)
            self.emit("staging", scratch_removed.claimed_again(cfg.scratch_dir) if gone else
                      scratch_remade.partly_removed_words(cfg.scratch_dir))
        return None

    def tick(self) -> Staged | StagingFailed | None:
        if self.worker is None:
            if now() < (self.fetch_retry_at if self.awaiting_remote is not None else self.source_retry_at):
                return None  # waiting for the remote, a source or room, to try again
            if refused := self.reclaim():
                self.state.staging.state, self.state.staging.error = StagingState.FAILED, refused
                return StagingFailed(f"config error, final: {refused}", protocol.SUPERVISOR_CONFIG)
            self._start()
            return None
        if not self.worker.done:
            self._flag_stalled_fetch()
            self._flag_stalled_read()
            return None
        worker, self.worker = self.worker, None
        self.inbox.drain()
        self._answered_again()
        if worker.name == "inputs":
            return self._inputs_done(worker)
        staging = self.state.staging
        if isinstance(worker.error, SourceUnreachable):
            self.say_remote(self.remote_look)  # saved with the wait's own words
            self._wait_for("corpus source unreachable", str(worker.error))
            return None
        if isinstance(worker.error, ScratchFull):
            self._wait_for("no room in scratch", str(worker.error))
            return None
        if isinstance(e := worker.error, OSError) and is_disk_full(e) and made_in(e, self.cfg.scratch_dir):
            # a file of staging's own in scratch (its record, a temporary name) that found no room: not counted
            self._wait_for("no room in scratch", no_room(e, self.cfg.scratch_dir, top_of(self.cfg.scratch_dir)))
            return None
        if worker.error is not None:
            text = self._error_text(worker)
            staging.state, staging.error = StagingState.FAILED, text
            self.state.record_error(f"staging failed: {text}")
            status = self.infra.final_staging_status(worker.error)
            if status is not None:
                from minilmd.checkpoint import CheckpointMismatch  # numpy: only where a checkpoint is read

                kind = "data" if status == protocol.EXIT_DATA else \
                    "checkpoint" if isinstance(worker.error, CheckpointMismatch) else "config"
                return StagingFailed(f"{kind} error, final: {text}", status)
            return StagingFailed(text, None)
        staged, expected, fetched, fetch_error = worker.result
        if worker.name == "staging":
            self._waited_enough()
            staging.state, staging.path, staging.error, staging.finished = StagingState.DONE, str(staged), None, now()
            self.emit("staging", f"staged and verified: {staged} in {worker.running_for():.1f}s")
        if fetch_error is not None:
            self._remote_unavailable(staged, fetch_error)
            return None
        self.staged = staged
        if self.awaiting_remote is not None:
            self.awaiting_remote, self.fetch_failures = None, 0
            self.state.sync.state, self.state.sync.error = SyncState.IDLE, None
            staging.state, staging.error = StagingState.DONE, None
        if self.unlooked:
            self.emit("note", self.unlooked)
        for line in self.set_aside:  # a damaged remote step: status shows it as the last error
            self.emit("note", line)
            self.state.record_error(line)
        if fetched:
            # a sign of the remote's step for a later start (remotewait), on this remote
            self.emit("fetch", f"{self.fetched_why or 'scratch held no checkpoint'}: fetched {fetched} from "
                               f"{self.cfg.run.remote}",
                      step=step_of(Path(fetched)), remote=self.cfg.run.remote)
            # status shows it as the local checkpoint: the trainer resumes from it, though it did not save it
            self.state.local_checkpoint = LocalCheckpoint(step=step_of(Path(fetched)), time=now(), path=str(fetched),
                                                          fetched=True)
            self.state.local_gone = None  # scratch holds one again
        elif self.cfg.run.remote and not local_checkpoint_steps(self.cfg.checkpoint_dir):
            lineage = {"lineage": timeline.FRESH} if self.fresh else {}  # records before it are another lineage's
            self.emit("fetch", f"{self.from_step_0 or 'scratch holds no checkpoint'}: starting from step 0",
                      remote=self.cfg.run.remote, **lineage)
            if self.fresh:
                self._mark_fresh()
            if self.fresh and self.state.remote_checkpoint is not None:  # of the run before: not this lineage's
                self.emit("fetch", f"--fresh: the remote step {self.state.remote_checkpoint.step} state.json "
                                   f"recorded is forgotten; this run syncs its own checkpoints from now on")
                self.state.remote_checkpoint = None
        if self.removed is not None:
            kept = max(local_checkpoint_steps(self.cfg.checkpoint_dir), default=None)  # a partly removed one's
            said = scratch_removed.resumed(self.cfg.scratch_dir, step_of(Path(fetched)) if fetched else None,
                                           self.removed[0], kept)
            self.emit("staging", said)
            self.state.record_error(said)  # status's last error: why the steps since are trained again
            self.removed = None
        self.record_shape_change()
        # the first staging has ended: a later one waits as any run does
        self.fresh, self.records, self.fetch_set_aside = False, None, ()
        if initstage.needed(self.cfg):  # the probe and init.from next, in a thread of their own
            self.pending = Staged(staged, expected, fetched)
            self._start()
            return None
        self.inputs = {}
        return Staged(staged, expected, fetched)

    def record_shape_change(self, staged: bool = True) -> None:
        """Scratch's newest checkpoint (the one the trainer resumes from) recording other batch stream settings than
        the run has now (minilmd/batch_stream.py): event "data_shape", and a line in state.json's shape_changes, for
        which `status` says the run is not bit-reproducible. A start from step 0 (a new lineage) forgets them. Also
        called by the supervisor when its OOM retry sets a smaller micro-batch (a relaunch stages nothing; `staged`
        False): the line says it was that retry, and a later staging finding the same change says it no more."""
        newest = newest_recorded(self.cfg.checkpoint_dir)
        if newest is None:
            if staged:  # staging's start from step 0; not the supervisor's retry, which a staging may follow
                self.state.shape_changes = []
            return
        step, recorded = newest
        changes = stream_changes(self.cfg, recorded, self.state.overrides, self.ranks() if self.ranks else None)
        line = f"step {step:,}: {', '.join(changes)}"
        if changes and line not in self.state.shape_changes:  # a restart before the next save: said once
            self.state.shape_changes.append(line)
            self.emit("data_shape", change_note(step, changes), step=step, changes=changes)

    def _mark_fresh(self) -> None:
        """metrics.jsonl's marker of the new lineage (daemon/base/timeline.py): `status` and `plot` read what follows
        it only. One that cannot be written (run.dir full) is said: the views then mix the two timelines."""
        try:
            timeline.mark_fresh(self.cfg.run_dir, now())
        except OSError as e:
            self.emit("fetch", f"--fresh: the new lineage's start could not be marked in {names.METRICS} "
                               f"({e.strerror or e}): status and plot show the earlier timeline's steps with it")

    def _error_text(self, worker: Worker) -> str:
        """What a failed staging says: a remote checkpoint of another model, corpus or tokenizer in the words `run
        --check` and the launch refuse it with (daemon/jobs/resumefrom.py refusal: no class name, no temporary
        path), any other error as it was raised."""
        from minilmd.checkpoint import CheckpointMismatch  # numpy: only where a checkpoint is read

        if not isinstance(worker.error, CheckpointMismatch):
            return worker.error_text
        from minilmd.daemon.jobs.resumefrom import refusal

        return refusal(worker.error, f"on the remote {self.cfg.run.remote}")

    def _inputs_done(self, worker: Worker) -> Staged | StagingFailed | None:
        """The probe and init.from staged (the trainer gets their copies), unreachable (wait, retry: never
        final), or read and wrong (final, as when the trainer refused them: 65 for the probe, 2 for init.from)."""
        from minilmd.init_source import InitSourceError

        staging, error = self.state.staging, worker.error
        if isinstance(error, SourceUnreachable):
            self._wait_for("probe source unreachable" if isinstance(error, ProbeUnreachable) else
                           "init source unreachable", str(error))
            return None
        if error is not None:
            staging.state, staging.error = StagingState.FAILED, worker.error_text
            self.state.record_error(f"staging failed: {worker.error_text}")
            status = protocol.SUPERVISOR_CONFIG if isinstance(error, InitSourceError) else \
                self.infra.final_staging_status(error)
            if status is not None:
                kind = "data" if status == protocol.EXIT_DATA else "config"
                return StagingFailed(f"{kind} error, final: {worker.error_text}", status)
            return StagingFailed(worker.error_text, None)
        self._waited_enough()
        self.inputs, notes = worker.result
        if notes is not None:
            self._say_notes(notes)
        pending, self.pending = self.pending, None
        assert pending is not None  # set when this worker started
        return pending

    def _say_notes(self, notes: list[str]) -> None:
        """What init.from's checkpoint, just staged, says the run may not mean (stage_notes.init_from_notes): into
        supervisor.log and events.jsonl (event "note") and state.json's notes, which `status` shows. Notes, never a
        refusal: the same tokenizer saved again has other bytes."""
        self.state.notes = list(notes)
        for note in notes:
            self.emit("note", note)

    def _wait_for(self, what: str, error: str) -> None:
        """Staging cannot go on now, and no retry counts (`what`: "corpus source unreachable", "probe source
        unreachable", "init source unreachable", "no room in scratch"): another try after a backoff, for as long
        as it takes; status says so."""
        staging = self.state.staging
        self.source_failures += 1
        delay = backoff_seconds(self.cfg.restart, self.source_failures, self.rng)
        self.source_retry_at = now() + delay
        if staging.unreachable_since is None or staging.waiting not in (None, what):
            staging.unreachable_since = now()
        staging.unreachable, staging.waiting = error, what
        self.state.record_error(f"{what}: {error}")
        self.emit("staging", f"{what}: {error}; try {self.source_failures} failed, next in {delay:.1f}s (not a "
                             f"failure: waiting for it)")
        self.state.save()

    def _waited_enough(self) -> None:
        """A try after `_wait_for` went through: the wait is over."""
        staging = self.state.staging
        if staging.unreachable_since is not None:
            over = WAIT_OVER.get(staging.waiting or "init source unreachable", "staging can go on again")
            self.emit("staging", f"{over} after {now() - staging.unreachable_since:.0f}s")
        staging.unreachable = staging.unreachable_since = staging.waiting = None
        self.source_failures = 0
        self.say_remote("")  # the corpus answers: the fetch and the syncs look at the remote from here on

    def _start(self) -> None:
        staging = self.state.staging
        if self.pending is not None:  # the corpus is staged; the probe and init.from (again, after a backoff)
            synced = self.state.remote_checkpoint is not None  # its remote holds something: empty is unmounted
            self.worker = Worker("inputs", lambda: _stage_inputs(
                self.cfg, self.inbox.put, self.reads, functools.partial(_base_from_remote, synced_before=synced)))
            return
        if self.awaiting_remote is not None:  # staged; only the fetch of a remote checkpoint is retried
            staged = self.awaiting_remote
            staging.state, staging.error, staging.progress = StagingState.FETCHING, None, None
            self.emit("fetch", f"retrying the fetch of the newest checkpoint from {self.cfg.run.remote}")
            self.worker = Worker("fetch", lambda: (staged, *self._fetch_job(staged)))
            return
        staging.state, staging.since, staging.error, staging.progress = StagingState.RUNNING, now(), None, None
        staging.from_copy = None  # set by the thread if the source cannot be read and the staged copy is used
        self.emit("staging", f"staging {self.cfg.data.prepared} into {self.cfg.scratch_dir}")
        self.worker = Worker("staging", self._stage_job)

    def _flag_stalled_read(self) -> None:
        """A source whose reads have not returned for `stalled_after_s`: stalled, in state.json and the log
        (once); a read that returns again ends it."""
        what, answered = self.reads.what, self.reads.answered
        if not what or now() - answered <= self.stalled_after_s:
            self._answered_again()
            return
        staging = self.state.staging
        if staging.stalled is not None and staging.stalled.what == what and staging.stalled.since == answered:
            return
        staging.stalled = StagingStall(what=what, since=answered)
        said = not_answering(what, answered)
        self.state.record_error(said)
        self.emit("staging", f"{said}: waiting for it (not a failure)")
        self.state.save()

    def _answered_again(self) -> None:
        stall = self.state.staging.stalled
        if stall is None:
            return
        self.state.staging.stalled = None
        self.emit("staging", f"{stall.what} answering again after {now() - (stall.since or now()):.0f}s")

    # --- in the thread ----------------------------------------------------------------------------------------------
    def _stage_job(self):
        """Stage the corpus, then fetch a remote checkpoint when scratch holds none, or an older one."""
        def progress(*args):
            self.reads.answer()  # a chunk copied from the source
            info = args[0] if len(args) == 1 else list(args)
            self.state.staging.progress = info.describe() if hasattr(info, "describe") else info

        self.reads.reading(f"the corpus source {self.cfg.data.prepared}")
        try:
            staged = self.infra.stage(self.cfg, progress, self.inbox.put,
                                      lambda why: setattr(self.state.staging, "from_copy", why))
        except SourceUnreachable:  # its share gone: run.remote's may be too (user F9), looked at here, bounded
            self.remote_look = self.look_at_remote()
            raise
        finally:
            self.reads.reading("")  # the fetch has its own stall report ("remote unavailable")
        return (staged, *self._fetch_job(staged))
