"""The supervisor's side of sync: when to copy a checkpoint to the remote, one copy at a time in a thread, what its
result means for state.json, the last sync when the run stops, and when local checkpoints in scratch may be deleted.

The copy itself is daemon/jobs/sync.py (blocking; a stalled NFS may hold it for minutes). Here it runs in a `Worker`
thread that the supervisor's loop polls every tick, so that a stalled or failing remote never blocks the loop or
the trainer; status shows "stalled"/"failed" with the cause. Pruning of scratch is decided here too, because only
the supervisor knows what is synced and what is being synced (the trainer does not prune under a supervisor):

- after each verified sync: keep the newest `train.keep_local` valid checkpoints and the newest synced one;
- without a remote: keep the newest `train.keep_local`;
- while the remote has been failing for a while (2 x sync.every, at least a minute): keep the newest
  `train.keep_local` only, so that scratch (RAM) does not fill up;
- whenever scratch has no room for the next ROOM_FOR checkpoints (`make_room`, every tick while a trainer may
  save): the oldest go, synced or not, until there is (the newest supersedes them), and a sync starts early;
- never the checkpoint a running sync is copying; never the newest valid one (checkpoint_select.prune's own rule).
The pruning itself is the mixin daemon/jobs/scratchprune.py. Torch-free.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from minilmd import names
from minilmd.backoff import SYNC_RETRY_FIRST_S, exponential
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base.knobs import DEFAULTS, Knobs
from minilmd.daemon.base.runstate import RunState, now
from minilmd.daemon.base.statesections import RemoteCheckpoint
from minilmd.daemon.base.worker import Inbox, Worker, error_words
from minilmd.daemon.jobs.lastsyncrule import nothing_to_push
from minilmd.daemon.jobs.remote_full_words import full_why, full_words
from minilmd.daemon.jobs.scratchprune import ScratchPruning
from minilmd.daemon.jobs.sync_errors import (  # light: the Syncer (numpy) is loaded lazily
    RemoteFull,
    RemoteNotOurs,
    RemoteOfAnotherRun,
)
from minilmd.protocol import FINAL_SYNC_WAITING
from minilmd.run_states import SyncState

if TYPE_CHECKING:
    from minilmd.daemon.jobs.sync import Syncer

FINAL_SYNC_TRIES = 3
"""Attempts of the last sync after the trainer finished or stopped before the supervisor gives up on it."""
FINAL_STALL_PATIENCE = 2
"""The last sync is given up on once nothing moved (no byte, no answer) for this many times the stall limit; a slow
one that moves is waited for, however long it takes."""
BASE_COPY = "the LoRA base's copy"
REMOTE_FULL_REMIND_S = 600.0
"""A remote that stays full is said when it becomes full, then again at most this often (not at every retry)."""
LOOK_AGAIN_S = 30.0
"""With nothing newer than the remote's to sync (no checkpoint saved yet), the periodic sync looks again after
min(sync.every, this), not a whole sync.every later: a run's first checkpoint is synced within this of its save."""


class SyncWorker(ScratchPruning):
    """Owns the Syncer, the sync thread and the retry/prune timing. `state` is the run's RunState (its "sync" and
    "remote_checkpoint" entries are written here), `emit(kind, message, **details)` logs an event, `inbox` takes
    the Syncer's messages from its thread; `knobs` how long a sync may move nothing before it is stalled, how long
    a failing remote is waited for before scratch is pruned without a sync (daemon/base/knobs.py)."""

    def __init__(self, cfg, infra, state: RunState, emit, inbox: Inbox, knobs: Knobs = DEFAULTS):
        self.cfg = cfg
        self.infra = infra
        self.state = state
        self.emit = emit
        self.inbox = inbox
        self.stalled_after_s = knobs.sync_stalled_after_s
        self.prune_unsynced_after_s = knobs.prune_unsynced_after_s
        self.syncer: Syncer | None = None
        self.worker: Worker | None = None
        self.next_at = 0.0
        self.pass_sent: int | None = None
        """The pairs of the DPO reference pass step 0 held at the last periodic sync begun (the pass saves it
        periodically, trainer/loop/dpo_reference.py): one saved further on is synced too, though no newer step."""
        self.failures = 0
        self.failing_since: float | None = None  # the first of `failures` failed syncs in a row
        self.final_tries = 0
        self.trainer_launched = False  # in this start (daemon/attempt.py): it may have saved what the last sync pushes
        self.final_waits_for_room = False  # final_sync's wait_for_room: a full remote counts no try
        self.remote_full: tuple[int | None, int | None] | None = None  # (needs, free) when the last sync found no room
        self.remote_inodes: int | None = None  # the remote's inode count when none was left (what ran out)
        self.full_of = ""  # what found the remote full, when not a checkpoint: "the LoRA base's copy"
        self.full_said_at: float | None = None  # when `remote_full` was last said; None: not full when last tried
        self.waited_for_room = False  # the last sync has waited for room on the remote
        self.room_wait = ""  # why the last sync waits (room, the owner record), its latest try's: the phase's reason
        self.claim_wait_said = ""  # the owner record's refusal the last sync's wait last said ("": it has not waited)
        self.not_ours = ""  # why the last sync was refused: run.remote's owner record no longer this run's, or its root
        self.refusal: type[RemoteNotOurs] = RemoteNotOurs  # its kind: what it is and waits for, in words (RemoteGone)
        self.final_refusal = ""
        """Why run.remote is another run's, in a line, once a sync was refused so (RemoteOfAnotherRun): final, as at
        the launch. No more sync is begun; the loop stops the run (daemon/supervisor.py), the last sync ends at once
        with it, and the run ends as its launch would have been refused (daemon/ending.py)."""
        self.copying: Path | None = None  # the newest local checkpoint when the running sync started
        self.healthy_since = now()  # last verified sync, or the start: "the remote fails for a long time" from here
        self._sizes: dict[str, int | None] = {}  # checkpoint_bytes by step name: a checkpoint never changes

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.run.remote)

    def ensure_syncer(self, expected) -> bool:
        """Create the Syncer once (a bad remote never stops training: status shows it). True when there is one."""
        if self.syncer is None:
            try:
                self.syncer = self.infra.syncer(self.cfg, expected, self.inbox.put)
            except Exception as e:  # noqa: BLE001 - any error of the remote is a failing remote, in status
                self.state.sync.state, self.state.sync.error = SyncState.FAILED, error_words(e)
                return False
        return True

    def syncer_for(self, expected):
        """The Syncer, or a new one for a job that needs the remote before training starts (the fetch)."""
        return self.syncer or self.infra.syncer(self.cfg, expected, self.inbox.put)

    def running_for(self) -> float:
        return self.worker.running_for() if self.worker is not None else 0.0

    # --- each tick ------------------------------------------------------------------------------------------------
    def tick(self, periodic: bool) -> None:
        """Collect a finished sync, flag a stalled one, start a periodic one when due (if `periodic`), and prune
        scratch when the remote has been failing for long."""
        if not self.enabled:
            if len(local_checkpoint_steps(self.cfg.checkpoint_dir)) > self.cfg.train.keep_local:
                self._prune(protect=[], why=f"no remote: the newest {self.cfg.train.keep_local} stay")
            return
        if self.syncer is None:
            return
        if self.final_refusal and self.worker is None:
            return  # the run stops: no sync begins (one would be refused), nothing pruned as if the remote were down
        if self.worker is not None:
            if not self.worker.done:
                self._judge_running("training goes on")
                self._prune_if_remote_down()
                return
            self._collect()
            return
        self._prune_if_remote_down()
        if periodic and now() >= self.next_at:
            newest = max(local_checkpoint_steps(self.cfg.checkpoint_dir), default=None)
            remote = self._remote_step()
            from minilmd.checkpoint import saved_pass  # numpy and safetensors: not before staging (import budget)

            kept = saved_pass(self.cfg.checkpoint_dir / names.step_name(0)) if newest == 0 else None
            if newest is not None and (remote is None or newest > remote or kept not in (None, self.pass_sent)):
                self.pass_sent = kept  # a DPO reference pass saved further on: the Syncer puts it in place there
                self._start("periodic sync")
            else:
                self.next_at = now() + min(self.cfg.sync.every_s, LOOK_AGAIN_S)

    def final_sync(self, staged: Path | None, wait_for_room: bool = False, fetched: int | None = None,
                   rewound: bool = False) -> str | None:
        """The stopping phase's last sync, one step per tick: None while it goes on; "" once the newest checkpoint
        is synced (or there is no remote, or no checkpoint); otherwise why it is not (FINAL_SYNC_TRIES failed tries,
        a stall: nothing moved for FINAL_STALL_PATIENCE x the stall limit, no Syncer). A slow sync that moves is
        waited for, however long. A sync already running when the stop came is waited for, then one more is made:
        the trainer saved a newer checkpoint on its way out. A remote that is full (ENOSPC, EDQUOT: on a checkpoint's
        copy, or on a LoRA run's base's, which fails a try though the checkpoints synced: _base_unsaved), with
        `wait_for_room` (the run finished; no stop was asked for), counts no try: the sync is tried again at the
        retry backoff of a sync during the run, for as long as it takes, and `room_wait` says so (the loop makes it
        the stopping phase's reason). A sync refused by run.remote's owner record (`not_ours`: another user's file,
        a record that cannot be read) is waited for alike (`_wait_for_claim`): a run that ended done with its last
        checkpoint only in scratch (exit 0, which no service manager restarts) lost it at the next reboot of a
        /dev/shm scratch.
        A stop while either waits ends it at once. A run.remote that is another run's (`final_refusal`) is no wait:
        the last sync ends at once, refused. On one server the wait holds nothing else (the trainer has exited,
        its GPU lease is given back); a Slurm job's allocation stays held, so there the caller gives `wait_for_room`
        only for daemon/slurm/lastsynccut.py FINAL_SYNC_WAIT_S. Nothing is pushed when scratch holds nothing newer
        than the remote is recorded to hold (`fetched`: the step this start's staging fetched; `rewound`: it
        resumed from an older step than the remote held, saying so; lastsyncrule.py)."""
        if not self.enabled or self.worker is None and not local_checkpoint_steps(self.cfg.checkpoint_dir):
            return ""
        self.final_waits_for_room = wait_for_room
        if self.syncer is None:
            try:
                expected = self.infra.expectation(self.cfg, staged) if staged else None
                self.syncer = self.infra.syncer(self.cfg, expected, self.inbox.put)
            except Exception as e:  # noqa: BLE001 - any error of the remote: say why no sync
                return f"no sync possible: {error_words(e)}"
        if self.worker is not None:
            if not self.worker.done:
                patience = FINAL_STALL_PATIENCE * self.stalled_after_s
                stalled = self._judge_running(f"the run's end waits for it until nothing moved for {patience:.0f}s")
                if stalled and self.silent_for() > patience:
                    return f"the last sync stalled ({self.state.sync.error})"
                return None  # running, however slowly, while it moves: waited for
            self._collect()
        if not local_checkpoint_steps(self.cfg.checkpoint_dir):  # scratch removed while a sync ran: it is waited for
            return ""  # and what it put on the remote recorded; ending.py judges the end (fault11 F2)
        if self.final_refusal:  # another run's remote: no try, no wait; ending.py ends the run as the launch refuses
            return f"the last sync was refused: {self.final_refusal}"
        waited = self.waited_for_room or bool(self.claim_wait_said)  # a sync of the wait's is the last sync's try
        if (self.final_tries > 0 or waited) and self.state.sync.state == SyncState.OK:
            return self._base_problem()
        if self.remote_full is not None and wait_for_room:
            self._wait_for_room()
            return None
        if self.not_ours and wait_for_room:
            self._wait_for_claim()
            return None
        if self.remote_full is not None and self.waited_for_room:  # a stop while waiting: not held up for hours
            return f"the last sync found the {self.state.sync.error}"  # remote full (needs, free): the error
        if self.not_ours and self.claim_wait_said:  # a stop while waiting for the record: no more tries
            return f"the last sync was refused: {self.not_ours}"
        if self.final_tries >= FINAL_SYNC_TRIES:
            return f"the last sync failed {self.final_tries} times: {self.state.sync.error}"
        newest = max(local_checkpoint_steps(self.cfg.checkpoint_dir), default=None)
        if not self.final_tries and (said := nothing_to_push(self.cfg.run.remote, self.state, newest, fetched,
                                                             self.trainer_launched, rewound)):
            self.emit("sync", f"the last sync pushes nothing: {said}")
            return ""
        if self.final_tries == 0 or now() >= self.next_at:
            self.final_tries += 1
            self._start(f"last sync (try {self.final_tries}/{FINAL_SYNC_TRIES})")
        return None

    def abandon(self, why: str) -> bool:
        """Give up on the running sync, if any (a Slurm job's end is near: daemon/slurm/lastsynccut.py); True if one
        ran. Its copy stops at its next chunk, or after its last before anything is put in place (the rename, LATEST,
        retention: sync.py `_go_on`), and removes its half copy (SyncAbandoned); one blocked in the
        remote until the process exits leaves its temporary name, which a later sync of the run removes
        (sync_leftovers.py). Nothing is put in place: the remote keeps its previous checkpoint."""
        worker, self.worker, self.copying = self.worker, None, None
        if worker is None:
            return False
        if self.syncer is not None and hasattr(self.syncer, "abandon"):  # waits for a repoint of LATEST under way
            self._placed_before_abandon(self.syncer.abandon(why))
        elif self.syncer is not None:
            self.syncer.abandoned = why
        sync = self.state.sync
        sync.state, sync.error, sync.since, sync.progress = SyncState.FAILED, why, now(), None
        return True

    def _placed_before_abandon(self, name: str) -> None:
        """The step the abandoned sync pointed LATEST at, newer than the record: recorded, as a sync's end would
        (its copy was read back before LATEST named it), so that the cut's words name what the remote holds."""
        step = names.step_or_none(name)
        known = self.state.remote_checkpoint.step if self.state.remote_checkpoint is not None else None
        if step is not None and (known is None or step > known):
            self.state.remote_checkpoint = RemoteCheckpoint(step=step, time=now(), verified=True,
                                                           path=f"{self.cfg.run.remote.rstrip('/')}/{name}")

    def silent_for(self) -> float:
        """Seconds since the running sync last moved a byte or had an answer from the remote (the Syncer's
        ReadWatch; the whole run of a Syncer without one), no more than it has run."""
        watch = getattr(self.syncer, "watch", None)
        return min(self.running_for(), watch.silent_for()) if watch is not None else self.running_for()

    def _judge_running(self, meanwhile: str) -> bool:
        """The one rule for a running sync, during the run and at its end: stalled once nothing moved for the stall
        limit (a hung NFS: no byte, no answer), however long it has run; slow, and waited for, while it moves (a
        2.4 GB checkpoint at 10 MB/s takes 4 minutes). state.json and the log say which, and `meanwhile` what the
        run does then. True when stalled."""
        sync, silent = self.state.sync, self.silent_for()
        watch = getattr(self.syncer, "watch", None)
        if silent > self.stalled_after_s:
            what = f" ({watch.what})" if watch is not None and watch.what else ""
            said, sync.state, sync.progress = sync.state, SyncState.STALLED, None
            sync.error = f"no byte moved for {silent:.0f}s{what}, sync running for {self.running_for():.0f}s"
            if said != SyncState.STALLED:
                self.emit("sync", f"the sync looks stalled ({sync.error}); {meanwhile}")
            return True
        if self.running_for() > self.stalled_after_s:
            shown, pace = sync.progress, watch.pace() if watch is not None else ""
            sync.progress = f"slow ({pace or f'running for {self.running_for():.0f}s'})"
            if sync.state == SyncState.STALLED:
                sync.state, sync.error = SyncState.RUNNING, None
                self.emit("sync", f"the sync moves again, {sync.progress}: waited for")
            elif shown is None:
                self.emit("sync", f"the sync is {sync.progress}, still moving: waited for")
        return False

    def _base_problem(self) -> str:
        """A LoRA run's checkpoints synced without a copy of its base (Syncer.base_problem): not a finished run
        (its adapters cannot be resumed, merged or loaded once init.from no longer holds the base), said; "" else."""
        problem = self.syncer.base_problem if self.syncer is not None else None
        return f"{problem}: the adapters cannot be resumed or merged once init.from no longer holds the base" \
            if problem else ""

    def _next_try(self, retry: float, error: BaseException) -> str:
        """What follows a failed sync: a retry in `retry` s, or none (the last of the final sync's tries; a full
        remote at the end of a finished run counts no try: retried)."""
        if not self.final_tries:
            return f"retry in {retry:.0f}s"
        if isinstance(error, RemoteFull) and self.final_waits_for_room:
            return f"retry in {retry:.0f}s (a full remote counts no try)"
        if isinstance(error, RemoteNotOurs) and self.final_waits_for_room:
            return f"retry in {retry:.0f}s (no try counts until {self.refusal.waits_for})"
        if self.final_tries >= FINAL_SYNC_TRIES:
            return f"that was the last of {FINAL_SYNC_TRIES} tries: no retry"
        return f"retry in {retry:.0f}s (try {self.final_tries}/{FINAL_SYNC_TRIES})"

    def _out_of_reach(self) -> str:
        """What a remote whose owner record is no longer this run's means: a remote out of reach, said why."""
        goes_on = "" if self.final_tries or self.claim_wait_said else "training goes on, "
        return (f"{self.refusal.what}: {goes_on}the checkpoints stay in scratch ({self.cfg.checkpoint_dir}) and "
                f"nothing is written to the remote; once {self.refusal.waits_for}, the syncs go on")

    def _say_remote_full(self, retry: float, error: BaseException) -> None:
        """A sync that found the remote full: said when the remote becomes full, then every REMOTE_FULL_REMIND_S,
        not at every retry (status and state.json have the numbers of the latest try)."""
        if self.full_said_at is not None and now() - self.full_said_at < REMOTE_FULL_REMIND_S:
            return
        still = f"still, {self.failures} syncs in a row: " if self.full_said_at is not None else ""
        self.full_said_at = now()
        why = full_why(self.cfg, self.remote_full, self.remote_inodes)
        self.emit("sync", f"{still}{self.state.sync.error}; {why}; "
                          f"{self._next_try(retry, error)}, said again in {REMOTE_FULL_REMIND_S / 60:.0f} min if "
                          f"it stays full")

    def _wait_for_room(self) -> None:
        reason = f"{FINAL_SYNC_WAITING}{full_words(self.remote_full, self.remote_inodes, self.full_of)}"
        if not self.waited_for_room:
            self.waited_for_room = True
            self.emit("sync", f"{reason}: the last sync is tried again until it fits, no try counts; the "
                              f"checkpoint stays in {self.cfg.checkpoint_dir}")
        self.room_wait = reason  # status and state.json: the numbers of the latest try
        if now() >= self.next_at:
            self._start("last sync (waiting for room on the remote)")

    def _wait_for_claim(self) -> None:
        """The finished run's last sync waits for run.remote's owner record to be this run's again, or gone: said
        when the wait begins and whenever the refusal changes (another owner, another run's record), then tried
        again at the retry backoff, no try counted. Nothing is held meanwhile: the trainer has exited, and the loop
        gives the GPU back (daemon/ending.py)."""
        reason = f"{FINAL_SYNC_WAITING}{self.not_ours}"
        if self.claim_wait_said != self.not_ours:
            self.claim_wait_said = self.not_ours
            self.emit("sync", f"{reason}: the last sync is tried again until {self.refusal.waits_for}, no try counts; "
                              f"the checkpoint stays in {self.cfg.checkpoint_dir}; `minilmd stop` ends the run with "
                              f"it there")
        self.room_wait = reason
        if now() >= self.next_at:
            self._start(f"last sync (waiting until {self.refusal.waits_for})")

    def _start(self, why: str) -> None:
        sync = self.state.sync
        sync.state, sync.since, sync.attempts, sync.progress = SyncState.RUNNING, now(), sync.attempts + 1, None
        self.emit("sync", f"{why}: syncing the newest valid checkpoint to {self.cfg.run.remote}")
        newest = max(local_checkpoint_steps(self.cfg.checkpoint_dir), default=None)
        self.copying = self.cfg.checkpoint_dir / names.step_name(newest) if newest is not None else None
        assert self.syncer is not None  # tick() and final_sync() return before this without a Syncer
        self.worker = Worker("sync", self.syncer.sync_newest)

    def _collect(self) -> None:
        worker, self.worker = self.worker, None
        assert worker is not None  # called for a finished sync only
        copied = self.copying
        self.copying = None
        self.remote_full = None
        self.inbox.drain()
        sync = self.state.sync
        sync.progress = None
        every = self.cfg.sync.every_s
        if worker.error is not None:
            self.failures += 1
            self.failing_since = self.failing_since if self.failures > 1 and self.failing_since else now()
            retry = exponential(SYNC_RETRY_FIRST_S, self.failures, cap_s=every)
            self.next_at = now() + retry
            said = error_words(worker.error)
            if isinstance(worker.error, RemoteFull):  # what the checkpoint needs, what the remote had left
                self.remote_full = (self._size(copied.name) if copied is not None else None, worker.error.free)
                self.remote_inodes, self.full_of = worker.error.inodes, ""
                said = f"{full_words(self.remote_full, self.remote_inodes, self.full_of)}: {said}"
            sync.state, sync.error, sync.since = SyncState.FAILED, said, now()
            self.state.record_error(f"sync failed: {said}")
            if isinstance(worker.error, RemoteOfAnotherRun):
                self._refused_for_good(worker.error)
                return
            self.not_ours = said if isinstance(worker.error, RemoteNotOurs) else ""
            self.refusal = type(worker.error) if isinstance(worker.error, RemoteNotOurs) else RemoteNotOurs
            if self.remote_full is not None:
                self._say_remote_full(retry, worker.error)
                return
            self.full_said_at = None
            what = f"sync refused ({said}); {self._out_of_reach()}" if self.not_ours else f"sync failed ({said})"
            self.emit("sync", f"{what}; {self._next_try(retry, worker.error)}")
            return
        result = worker.result
        base_unsaved = bool(self.final_tries or self.waited_for_room or self.claim_wait_said) and self._base_problem()
        if not base_unsaved:  # else a failed try all the same (_base_unsaved): its backoff and words go on
            self.failures, self.failing_since, self.full_said_at = 0, None, None
        self.not_ours = ""
        self.next_at = now() + every
        sync.state, sync.error, sync.since, sync.last_ok = SyncState.OK, None, now(), now()
        step = getattr(result, "step", None)
        if step is None:
            self.emit("sync", "nothing to sync: no valid local checkpoint")
            return
        verified = bool(getattr(result, "verified", False))
        self.state.remote_checkpoint = RemoteCheckpoint(step=step, time=now(), verified=verified,
                                                       path=str(getattr(result, "path", "")))
        self.emit("sync", f"synced step {step} to {self.cfg.run.remote} (verified: {verified}) in "
                          f"{worker.running_for():.1f}s", step=step, verified=verified, remote=self.cfg.run.remote)
        if verified:
            self.healthy_since = now()
            self._prune(protect=[self.cfg.checkpoint_dir / names.step_name(step)],
                        why=f"the newest {self.cfg.train.keep_local} and the synced step {step} stay")
        if base_unsaved:
            self._base_unsaved(base_unsaved)

    def _refused_for_good(self, error: RemoteOfAnotherRun) -> None:
        """A sync refused because run.remote is another run's: said once in the log with every way on (the refusal
        whole: `minilmd logs`), and kept in a line (`final_refusal`) for status and the run's end."""
        if not self.final_refusal:
            self.emit("sync", f"sync refused, final: {error.detail or error}; the run stops as its launch would "
                              f"have been refused (exit 2), its checkpoints kept in {self.cfg.checkpoint_dir}")
        self.final_refusal = str(error)

    def _base_unsaved(self, problem: str) -> None:
        """A last sync whose checkpoints are synced but not a LoRA run's base (Syncer.base_problem) is a failed try,
        retried at the retry backoff: its push's ENOSPC or EDQUOT is a full remote, waited for as a checkpoint's
        (final_sync's wait_for_room); any other cause counts among the FINAL_SYNC_TRIES. Before, the run ended
        failed at the first such try, and no restart tried again (daemon/jobs/rundone.py called it done)."""
        full: RemoteFull | None = getattr(self.syncer, "base_full", None)
        self.failures += 1
        retry = exponential(SYNC_RETRY_FIRST_S, self.failures, cap_s=self.cfg.sync.every_s)
        self.next_at = now() + retry
        sync = self.state.sync
        sync.state, sync.error = SyncState.FAILED, problem
        if full is not None:
            self.remote_full, self.remote_inodes, self.full_of = (full.needs, full.free), full.inodes, BASE_COPY
            sync.error = f"{full_words(self.remote_full, self.remote_inodes, self.full_of)}: {problem}"
        self.state.record_error(f"sync failed: {sync.error}")
        if full is None or self.full_said_at is None or now() - self.full_said_at >= REMOTE_FULL_REMIND_S:
            self.full_said_at = now() if full is not None else None
            self.emit("sync", f"the last sync copied the checkpoints, not the LoRA base: {sync.error}; "
                              f"{self._next_try(retry, full or RuntimeError(problem))}")
