"""`minilmd run`: one supervisor per run directory, one loop, one phase at a time.

    waiting_gpu -> staging -> starting -> training -> (backoff -> starting | staging | waiting_gpu)* -> stopping -> done
                               starting | training -> waiting_space -> starting (a checkpoint did not fit in scratch)
                                                                                         any live phase -> failed

The phases and the allowed transitions are in daemon/base/states.py. The phase is one record, state.json's
(`self.phase` reads it): the start sets the first one (states.check_start), then `_go()` alone changes it, and it
logs each change (events.jsonl, supervisor.log, stdout) and rewrites state.json (the run's files: daemon/runfiles.py).
The parts never write the phase's reason: they return its text, and the loop sets it (`_go()`, or `_say()` for a
phase that goes on with a newer reason).
Signal handlers (daemon/host/signals.py) only record the signal; the loop acts on it at the next tick. Each tick
calls the phase's handler (HANDLERS, below the class); the phases that wait on something have a part of their own
that the tick asks: the GPU, staging and the remote fetch, the sync and pruning, room in scratch (daemon/phases/,
daemon/jobs/). Their blocking jobs run in threads (daemon/base/worker.py), so a stalled NFS never freezes the loop or
the trainer, and the loop never waits for a process without a bound: a trainer killed in uninterruptible I/O is
reaped by a later poll. The trainer is a child process (daemon/child/process.py), watched through
daemon/child/trainerwatch.py (orphans, its command, a hang, a kill not reaped); what to do when it ends is
daemon/child/policy.py. GPU admission, staging, sync, pruning, launch are reached through `Infra` (daemon/infra.py),
a few methods that tests can replace. A trainer's launch, its watch and its end are daemon/attempt.py;
stopping, the last sync and the exit are daemon/ending.py (both mixins of the Supervisor).

Running out of room is no restart loop. A full scratch: the syncworker prunes superseded checkpoints before the
trainer needs the room; a trainer whose save did not fit anyway waits in `waiting_space` until one does, never counted
as a restart. A full run.dir: the writes of state and events keep failing quietly (daemon/base/runstate.py); a live one
goes on, and once it has ended the run stops after its last sync, with exit 73 (final). That part is `self.room`
(daemon/phases/rundirwatch.py): it writes state.json, says once that run.dir is full, and is asked before each launch
and at each end of the trainer. Torch-free.
"""
from __future__ import annotations

import os
import random
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from minilmd import protocol, scratch_hold, scratch_root
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.config import ConfigError, RunConfig, given_sets
from minilmd.daemon import preflight
from minilmd.daemon.aftersync import AfterSync
from minilmd.daemon.attempt import Attempt
from minilmd.daemon.base import knobs, stoprequest
from minilmd.daemon.base.runstate import now
from minilmd.daemon.base.states import (
    ATTEMPT_PHASES,
    FINAL_PHASES,
    Action,
    Cause,
    Phase,
    check_start,
    check_transition,
    first_phase,
)
from minilmd.daemon.base.worker import Inbox
from minilmd.daemon.child import orphans, trainerwatch
from minilmd.daemon.child.grace import save_grace
from minilmd.daemon.child.policy import backoff_seconds, decide_staging_failure
from minilmd.daemon.ending import Ending
from minilmd.daemon.host import registry, sdnotify
from minilmd.daemon.host.lock import LockHeld, LockUnsafe
from minilmd.daemon.host.sdnotify import Notifier
from minilmd.daemon.host.signals import LaunchStopped, Signals
from minilmd.daemon.infra import Infra
from minilmd.daemon.jobs import remote_consent, runidentity
from minilmd.daemon.jobs.stagingworker import StagingFailed, StagingWorker
from minilmd.daemon.jobs.syncworker import SyncWorker
from minilmd.daemon.loopstate import Backoff, SupervisorState
from minilmd.daemon.phases import initwait
from minilmd.daemon.phases.gpuwait import GpuUnavailable, GpuWaiter
from minilmd.daemon.phases.rundirwatch import RunDirWatch, full_at_start
from minilmd.daemon.phases.spacewait import SpaceWaiter
from minilmd.daemon.runfiles import RunFiles
from minilmd.daemon.slurm import job as slurmjob

TICK_S = 0.2
"""The loop's period: how fast a death, a signal or a heartbeat is noticed."""


class Supervisor(Attempt, Ending):
    """One run directory's supervisor: `run()` takes the run lock, then ticks until a final phase."""

    def __init__(self, cfg: RunConfig, config_path: str, cli_overrides: list[str] | None = None,
                 infra: Infra | None = None, echo: bool = True, fresh: bool = False, claim_remote: bool = False,
                 resumes: bool = False, held: preflight.Held | None = None, signals: Signals | None = None):
        self.cfg = cfg
        self.fresh = fresh  # `run --fresh`: no wait for a remote out of reach at the first staging (only)
        self.claim_remote = claim_remote  # `run --claim-remote`: run.remote made this run's once its lock is held
        self.config_path = Path(config_path)
        self.cli_sets = given_sets(cli_overrides)  # made absolute now: the working directory may be deleted later
        self.infra = infra or Infra()
        self.run_dir = cfg.run_dir  # settled by run() (preflight.launch has already: its real path)
        self.echo = echo
        # `minilmd run`'s, installed at its start (the wait's, if it waited): a stop since is the first tick's
        self.signals = held.signals if held else signals or Signals()
        self.notifier = Notifier()
        self.rng = random.Random()
        self.loop = SupervisorState(resumes=resumes, held=held)  # the loop's own record beside state.json's
        # run() sets up, once the run directory is ours: events, metrics, state, room, inbox, gpu, staging, sync, space

    # --- the run, from lock to exit status ------------------------------------------------------------------------
    def run(self) -> int:
        from minilmd.place_rule import PlaceRefused, settle_run_dir

        self.signals.install()  # first: a stop from here on is the first tick's, never the process's default end
        try:  # made and judged in one walk, once: every file after goes under its real path (no resolve() later)
            self.run_dir = settle_run_dir(self.run_dir)
            self.cfg.run.dir = str(self.run_dir)
            lock = preflight.run_lock(self.loop.held, self.run_dir)  # the launch's wait's, if it waited: kept held
        except (LockHeld, LockUnsafe, PlaceRefused) as e:
            print(f"minilmd run: {e}", flush=True)
            return self._ends_early(protocol.SUPERVISOR_CONFIG, str(e))
        except OSError as e:
            if not self._full_at_start(e):
                raise
            return self._ends_early(protocol.SUPERVISOR_RUN_DIR_FULL, f"run.dir {self.run_dir} is full")
        try:
            self._prepare_files()
        except OSError as e:
            if not (full := self._full_at_start(e)):
                print(f"minilmd run: cannot set up the run directory {self.run_dir}: {e}", flush=True)
            return self._ends_early(protocol.SUPERVISOR_RUN_DIR_FULL if full else 1, f"run.dir: {e}", lock)
        if self.claim_remote and (refused := remote_consent.take_over_at_launch(self.cfg, self.events.emit)):
            print(f"minilmd run: {refused}", flush=True)
            return self._ends_early(protocol.SUPERVISOR_CONFIG, refused, lock)
        try:
            self.files.adopt_previous_state(self.cfg.run.remote)
            self.after_sync = AfterSync(self.cfg, self.state, self.events.emit,  # from the adopted remote step
                                        finished=lambda: self.loop.last_cause == Cause.DONE)
            if left := runidentity.left_behind(self.cfg):  # an old scratch of this run: said, never left unsaid
                self.events.emit("adopt", left)
            start = initwait.at_start(self.cfg, resumes=self.loop.resumes or self.state.remote_checkpoint is not None,
                                      emit=self.events.emit)
            self.state.phase = check_start(first_phase(start.waits), waited=self.loop.held is not None)
            # READY before the orphan hunt: its grace can outlast systemd's start timeout
            self.notifier.ready(f"{self.cfg.run.name}: {self.phase}")
            trainerwatch.kill_orphans(self.cfg, self.run_dir, self.events.emit, self.notifier.watchdog)
            own_root = scratch_root.in_use(self.run_dir, self.cfg.scratch_dir.parent)  # the default's was taken
            self.events.emit("start", f"supervisor pid {os.getpid()} owns {self.run_dir} (config {self.config_path})"
                             + (f"; {own_root}" if own_root else ""), pid=os.getpid())
            start.say_share(self.events.emit)  # a first start from a finished base: what --check would have said
            if unit := sdnotify.own_unit():  # for `stop`: systemd's restart does not read a stop request
                self.state.supervisor.systemd_unit, self.state.supervisor.systemd_user = unit
            self._restarted(at_start=True)  # what the previous supervisor's trainers left: scratch may lack it
            self.state.save()
            self._stop_request_at_start()
            while self.phase not in FINAL_PHASES:
                self._tick()
                time.sleep(TICK_S)
        except Exception as e:  # noqa: BLE001 - a supervisor bug: leave a clear trace, never an orphan trainer
            if (message := self.room.crashed(e)) is not None:  # run.dir full where the loop did not expect it
                self.loop.exit_status = protocol.SUPERVISOR_RUN_DIR_FULL
            else:
                self.events.emit("crash", f"supervisor error: {type(e).__name__}: {e}",
                                 traceback=traceback.format_exc())
                message = f"supervisor error: {e}"
                self.loop.exit_status = protocol.SUPERVISOR_RETRY
            if self.loop.child and self.loop.child.poll() is None:
                self.loop.child.kill_group(grace=save_grace(self.cfg), while_waiting=self.notifier.watchdog)
            self.state.record_error(message)
        finally:
            self._shutdown(lock)
        return self.loop.exit_status

    def _ends_early(self, status: int, why: str, lock=None) -> int:
        """An exit before the start: the scratch wait's record, if it waited, ends so (scratchclaim.Held.refused)."""
        if self.loop.held is not None:
            self.loop.held.refused(status, why)
        scratch_hold.let_go(self.cfg.scratch_dir)  # the launch's hold (minilmd/scratch_hold.py): nothing started
        if lock is not None:
            lock.release()  # after that record's end: the wait's lock, if it waited
        return status

    def _full_at_start(self, e: OSError) -> bool:
        """full_at_start, and the run registered (its registry lies elsewhere, with room perhaps), so that `status`
        lists it: "could not start" (daemon/views/lastwords.py), not unknown. False when e is another error."""
        if not full_at_start(self.run_dir, e):
            return False
        registry.register_quietly(self.cfg.run.name, self.run_dir, self.config_path, lambda *_: None)
        return True

    def _prepare_files(self) -> None:
        self.files = RunFiles(self.cfg, self.run_dir, self.config_path, self.echo, self.notifier)
        self.events, self.state = self.files.events, self.files.state
        self.room = RunDirWatch(self.cfg, self.run_dir, self.state, self.events)  # makes the reserve
        self.loop.attempt = self.files.last_attempt()
        emit = self.events.emit
        self.inbox = Inbox(emit)  # messages from the worker threads, emitted by the loop
        self.gpu = GpuWaiter(self.cfg, self.infra, self.state, emit,
                             own_pids=lambda: orphans.find_orphans(self.run_dir))
        self.knobs = knobs.read()  # preflight judged them
        self.sync = SyncWorker(self.cfg, self.infra, self.state, emit, self.inbox, self.knobs)
        self.staging = StagingWorker(self.cfg, self.infra, self.state, emit, self.inbox, self.sync.syncer_for,
                                     self.rng, fresh=self.fresh, stalled_after_s=self.sync.stalled_after_s)
        self.space = SpaceWaiter(self.cfg, self.state, emit, self.sync)
        self.init_wait = initwait.InitWaiter(self.cfg, self.state, emit)
        self.files.publish(self.cfg, self.config_path)  # the Prometheus textfile, the registry entry
        self.slurm = slurmjob.for_supervisor(self.state, emit)  # None outside a Slurm job
        self.staging.ranks = lambda: self.slurm.nproc * self.slurm.alloc.nnodes if self.slurm else self.gpu.nproc

    # --- one tick of the loop -------------------------------------------------------------------------------------
    def _tick(self) -> None:
        self.inbox.drain()
        self._handle_signals()
        HANDLERS[self.phase](self)  # a live phase without a handler fails here, never idles
        self.files.read_progress()
        self.gpu.keep_lease()  # while the run holds its cards: its lease files touched, still named or taken again
        self._leave_lost_gpu()  # a card's lease another run holds now: its trainer saves and stops, no sharing
        live = self.phase in ATTEMPT_PHASES
        self.sync.tick(periodic=live or self.phase == Phase.WAITING_SPACE)
        if self.sync.final_refusal and self.phase not in FINAL_PHASES:  # run.remote is another run's: no wait ends it
            self._enter_stopping(f"{self.sync.final_refusal}: the run stops, as its launch would be refused")
        self.after_sync.tick(self.staging.running)  # a newer step on run.remote: the kept copy goes, the count resets
        if live:
            self.sync.make_room()  # before the trainer's next save needs it
        self.notifier.watchdog()
        self.room.tick(self.phase)  # state.json when due; says once that run.dir is full, once that it has room
        if self.room.removed and self.phase in ATTEMPT_PHASES and not self.room.stopping:  # no run.dir to train in
            self._enter_stopping(self.room.stop("the trainer is stopped"))
        self.files.tick(self.phase)  # the Prometheus textfile

    def _handle_signals(self) -> None:
        if self.slurm and self.signals.asked and not self.loop.stop_requested and \
                not stoprequest.asked_now(self.run_dir):  # `minilmd stop` writes its request before its SIGUSR2
            self.signals.usr2_as_warning()
            self.events.emit("slurm", "SIGUSR2 with no `minilmd stop` request in run.dir: Slurm's --signal "
                                      "warning (B:USR2), taken as its USR1")
        if self.signals.usr1 or (self.signals.stopping and self.slurm):
            slurmjob.on_signal(self.slurm, self.signals, self.events.emit)  # a preemption: a stop, then a requeue
        if self.signals.take_hup():
            self.events.reopen()
            self.events.emit("signal", "SIGHUP: supervisor.log reopened")
        if self.signals.stopping and not self.loop.stop_requested:
            self.loop.stop_requested, self.loop.stop_signals_taken = True, min(self.signals.stop, 1)
            by = "SIGTERM/SIGINT" if self.signals.stop else "`minilmd stop`'s SIGUSR2"
            self.events.emit("signal", f"stop requested ({by}): the trainer saves, then a last sync")
            self.notifier.stopping()
            self._enter_stopping("stop requested")
        elif self.signals.stop > self.loop.stop_signals_taken and (child := self.loop.child) and \
                child.poll() is None and child.killed_at is None:
            self.state.record_error(trainerwatch.kill_on_second_stop(self.cfg, child, self.events.emit))

    def _stop_request_at_start(self) -> None:
        """A stop request left while no supervisor ran (daemon/base/stoprequest.py at_start)."""
        stops = stoprequest.at_start(self.run_dir, os.environ, self.events.emit)
        if stops is not None:
            self.loop.stop_requested, (self.loop.stop_reason, words) = True, stops
            self._enter_stopping(words)

    @property
    def phase(self) -> Phase:
        """The phase the loop is in: state.json's record of it, the only one."""
        return Phase(self.state.phase)

    def _go(self, new: Phase, reason: str, **details) -> None:
        name = check_transition(self.phase, new)
        old = self.phase
        if new == Phase.STOPPING:
            self.staging.stop()  # a fetch reading damaged steps again ends now, not after its pauses
        self.state.phase = new
        self.state.since = now()
        self.state.reason = reason
        self.events.emit(name, f"{old} -> {new}: {reason}", transition=name, old=old, new=new, **details)
        self.notifier.phase(self.cfg.run.name, new, reason)
        self.room.save()

    def _restarted(self, at_start: bool = False) -> None:
        """Earlier trainers' lines folded in, their rate set aside (no ETA until the next trainer logs a step); at
        the start, a local checkpoint scratch no longer holds (a reboot, a new run.scratch) said gone."""
        self.files.read_progress()
        self.state.await_new_rates()  # the next trainer's heartbeats say its step and total
        if at_start and (gone := self.state.check_local(local_checkpoint_steps(self.cfg.checkpoint_dir))):
            moved = gone.path and Path(gone.path).parent != self.cfg.checkpoint_dir  # recorded in another scratch
            why = scratch_root.moved_words(self.run_dir, self.cfg.scratch_dir, Path(gone.path)) \
                if moved and gone.path else "emptied: a reboot?"
            self.events.emit("scratch", f"the local checkpoint step {gone.step} ({gone.path}) is gone from scratch "
                                        f"({why}); {self.state.resume_words()}", step=gone.step)

    def _say(self, reason: str) -> None:
        """The phase goes on with a newer reason (a part's wait, its numbers): state.json shows it at the next save."""
        self.state.reason = reason

    def _fail(self, status: int, message: str) -> None:
        self.loop.exit_status = status
        self.state.record_error(message)
        self._go(Phase.FAILED, message, exit=status)

    # --- waiting for the run init.from names, for a GPU, staging -----------------------------------------------------
    def _tick_waiting_init(self) -> None:
        outcome = self.init_wait.tick()
        if outcome is not None and outcome.failed:
            self._fail(protocol.SUPERVISOR_CONFIG, outcome.failed)
        elif outcome is not None:
            why = self.state.init_wait.why if self.state.init_wait else ""
            self._go(Phase.WAITING_GPU, f"init.from is ready: {why}" if why else "init.from is ready")

    def _tick_waiting(self) -> None:
        outcome = self.slurm.gpu_outcome(self.cfg.train.device, self.infra.open_nvml) if self.slurm \
            else self.gpu.tick()
        if isinstance(outcome, GpuUnavailable):
            self._fail(outcome.exit_status, outcome.error)
        elif outcome is not None:
            self._go(Phase.STAGING, outcome.reason, **({"devices": outcome.devices} if outcome.devices else {}))

    def _tick_staging(self) -> None:
        outcome = self.staging.tick()
        if outcome is None:
            return
        if isinstance(outcome, StagingFailed):
            self._on_staging_failed(outcome)
            return
        if self.cfg.run.remote:
            self.sync.ensure_syncer(outcome.expected)
        self._launch()

    def _on_staging_failed(self, failed: StagingFailed) -> None:
        """Act on policy.decide_staging_failure: fail, or back off and stage again (no trainer died: no Restart)."""
        streak = self.state.no_progress_streak + 1
        decision = decide_staging_failure(failed.error, failed.exit_status, restart=self.cfg.restart,
                                          no_progress_streak=streak)
        if decision.counts_as_restart:
            self.state.no_progress_streak = streak
        if decision.action == Action.FAIL:
            assert decision.exit_status is not None  # decide_staging_failure gives every FAIL its status
            self._fail(decision.exit_status, decision.message)
            return
        self._start_backoff(Phase.STAGING, decision.message, streak)

    def _start_backoff(self, after: Phase, reason: str, streak: int, delay: float | None = None) -> None:
        if delay is None:
            delay = backoff_seconds(self.cfg.restart, max(1, streak), self.rng)
        self.loop.backoff = Backoff(until=now() + delay, then=after)
        self._go(Phase.BACKOFF, f"{reason}; next: {after} in {delay:.1f}s", delay_s=round(delay, 2))

    def _tick_backoff(self) -> None:
        backoff = self.loop.backoff
        assert backoff is not None  # _start_backoff set it with the phase
        if now() < backoff.until:
            return
        after = backoff.then
        if after == Phase.STARTING:
            self._relaunch()
        elif after == Phase.STAGING:
            self._go(Phase.STAGING, "re-staging")
        else:
            self._go(Phase.WAITING_GPU, "waiting for a free GPU again")

    def _relaunch(self) -> None:
        """Launch again, unless scratch lost the staged corpus or its checkpoints meanwhile (then stage first)."""
        if not self.staging.staged_copy_present():
            self.staging.forget()
            self._go(Phase.STAGING, "the staged corpus is missing from scratch")
            return
        if self.cfg.run.remote and self.state.remote_checkpoint and not local_checkpoint_steps(self.cfg.checkpoint_dir):
            # the trainer would start from step 0: fetch the synced checkpoint first (staging reuses the copy)
            self._go(Phase.STAGING, "scratch lost its checkpoints: fetching the newest from the remote")
            return
        self._launch()

    # --- a checkpoint that does not fit in scratch -------------------------------------------------------------
    def _wait_for_space(self, fault: dict | None, message: str) -> None:
        """Scratch had no room (inodes or bytes) for the trainer's save (it wrote nothing), its lock, or the launch's
        compile caches (`fault`: the trainer's fault.json, None for the launch's): make room, launch again once a
        start and a checkpoint fit. A launch from this wait that finds none again goes on waiting."""
        self.state.record_error(message)
        reason = self.space.start(fault)
        wait = self.state.space_wait
        assert wait is not None  # space.start() began it
        if self.phase == Phase.WAITING_SPACE:
            self.events.emit("space", f"still no room: {message}")
            self._say(reason)
            return
        if fault is None:  # the launch's own words: no trainer's log nor fault.json says them
            self.events.emit("space", message)
        self._go(Phase.WAITING_SPACE, reason, needs=wait.needs, free=wait.free, inodes_free=wait.inodes_free)

    def _tick_waiting_space(self) -> None:
        if self.space.tick():
            self._relaunch()
        else:
            self._say(self.space.reason())


HANDLERS: dict[Phase, Callable[[Supervisor], None]] = {
    Phase.WAITING_INIT: Supervisor._tick_waiting_init,
    Phase.WAITING_GPU: Supervisor._tick_waiting,
    Phase.STAGING: Supervisor._tick_staging,
    Phase.STARTING: Supervisor._tick_child,
    Phase.TRAINING: Supervisor._tick_child,
    Phase.BACKOFF: Supervisor._tick_backoff,
    Phase.WAITING_SPACE: Supervisor._tick_waiting_space,
    Phase.STOPPING: Supervisor._tick_stopping,
}
"""What a tick does in each live phase: every phase but the final ones has one (tests/test_supervisor_dispatch.py)."""


def run_supervisor(config_path: str, overrides: list[str] | None = None, fresh: bool = False,
                   claim_remote: bool = False) -> int:
    """`minilmd run CONFIG`: preflight.launch (--check's checks, run.dir settled, scratch claimed: exit 2 on problems),
    then supervise to the end. `fresh`: `run --fresh`; `claim_remote`: `run --claim-remote` (remote_consent.py).
    The signal handlers come first (daemon/host/signals.py): a stop during the checks ends them at once, exit 0,
    nothing made (in a Slurm job a preemption, the job requeued as the scratch wait's: preempted_in_checks); one
    after is the supervisor's first tick's."""
    signals = Signals(checking=True)
    try:
        signals.install()
        cfg, resumes, held = preflight.launch(config_path, overrides, fresh, claim_remote, signals)
    except LaunchStopped as e:
        if (preempted := preflight.preempted_in_checks(str(e))) is not None:  # a Slurm job's: requeued, as later
            return preempted
        print(f"minilmd run: stopped ({e}) during the launch's checks: nothing made, nothing started", flush=True)
        return protocol.SUPERVISOR_DONE
    except ConfigError as e:
        print(f"minilmd run: {e}", flush=True)
        return protocol.SUPERVISOR_CONFIG
    except preflight.LaunchEnds as e:  # said there: run.dir full (73), or the run already done (0)
        return e.exit_status
    return Supervisor(cfg, config_path, overrides, fresh=fresh, claim_remote=claim_remote, resumes=resumes,
                      held=held, signals=signals).run()
