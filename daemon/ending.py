"""How a run ends: the trainer stopped, the last sync, the final phase and what is given back at exit.

The `Supervisor`'s own methods (daemon/supervisor.py), kept here as a mixin so that the loop and its ending read
apart. `stopping` is entered on a stop request, a finished trainer, a final decision or a full run.dir: the trainer gets
SIGTERM (SIGKILL after the save grace, or at a preempted Slurm job's deadline), a staging copy still running is waited
for a bounded time, then the last sync; its outcome decides `done` or `failed` (and a preempted Slurm job's requeue,
which the job's end does not wait for: a last sync still copying then is cut, daemon/slurm/lastsynccut.py). A last
sync that waits (room on the remote, run.remote's owner record) gives the GPU lease back while it waits; in a Slurm
job the allocation itself stays held, so that wait ends after lastsynccut.FINAL_SYNC_WAIT_S, never `finished` with
its last checkpoint unsynced: its newest checkpoint is kept in run.dir and the job requeued (`done`, ended
`requeued`: the requeued job resumes from that copy; a requeue scontrol refuses exits 1, saying to resubmit); where
Slurm will not requeue the job (Requeue=0), or nothing could be kept off the node's scratch, the run ends `failed`
(non-final), saying where the checkpoint is; `failed` for good (exit 79) once such requeues in a row are spent
(daemon/slurm/unsynced_end.py, requeue_bound.py). A trainer that ended done while its scratch was removed (gone,
replaced or unmarked, no checkpoint left to sync) sends the run back to staging (`restage`): the remote's newest is
fetched and the last steps trained again (daemon/jobs/scratch_removed.py). A run.remote found to be another run's
(SyncWorker.final_refusal) is no wait: the run ends as its launch is refused, `failed`, exit 2, its checkpoints kept
in scratch (in a Slurm job the newest in run.dir too), its reason saying the way on. At exit, whatever phase: a
trainer still there is killed, the GPU lease released, a final failure's staged inputs given back, the run's files
closed and the lock released. Torch-free.
"""
from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd import names, protocol, scratch, scratch_end, scratch_hold, scratch_remade
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.config import RunConfig
from minilmd.daemon.aftersync import AfterSync
from minilmd.daemon.base import stoprequest
from minilmd.daemon.base.knobs import Knobs
from minilmd.daemon.base.runstate import EventLog, RunState, now
from minilmd.daemon.base.states import Cause, Phase
from minilmd.daemon.child import trainerwatch
from minilmd.daemon.child.grace import STOP_WAITS_FOR_STAGING_S, save_grace
from minilmd.daemon.child.process import Child, wait_bounded
from minilmd.daemon.host.sdnotify import Notifier
from minilmd.daemon.jobs import lorabase, remote_claim, scratch_removed
from minilmd.daemon.jobs.initstage import INIT_DIR, PROBE_DIR
from minilmd.daemon.jobs.stagingworker import StagingWorker
from minilmd.daemon.jobs.syncworker import SyncWorker
from minilmd.daemon.loopstate import SupervisorState
from minilmd.daemon.phases.gpuwait import GpuWaiter
from minilmd.daemon.phases.rundirwatch import RunDirWatch
from minilmd.daemon.runfiles import RunFiles
from minilmd.daemon.slurm import lastsynccut, unsynced_end
from minilmd.daemon.slurm.job import SlurmJob

SAVE_CUT_REAP_S = 2.0
"""How long a trainer SIGKILLed at the Slurm job's end is waited for to be reaped (within jobend.REQUEUE_MARGIN_S)."""


class Ending:
    """Stopping, the last sync and the exit: the `Supervisor`'s methods for them (a mixin)."""

    loop: SupervisorState  # what the loop holds beyond state.json (daemon/loopstate.py), the ending's too
    # the supervisor's parts, made by Supervisor.run (daemon/supervisor.py)
    cfg: RunConfig
    run_dir: Path
    files: RunFiles
    events: EventLog
    state: RunState
    room: RunDirWatch
    gpu: GpuWaiter
    sync: SyncWorker
    staging: StagingWorker
    slurm: SlurmJob | None
    notifier: Notifier
    knobs: Knobs
    after_sync: AfterSync
    config_path: Path

    if TYPE_CHECKING:  # the loop's own (daemon/supervisor.py; _on_child_end: daemon/attempt.py)
        @property
        def phase(self) -> Phase: ...

        def _go(self, new: Phase, reason: str, **details) -> None: ...

        def _say(self, reason: str) -> None: ...

        def _fail(self, status: int, message: str) -> None: ...

        def _on_child_end(self, rc: int) -> None: ...

    # --- stopping and the last sync -----------------------------------------------------------------------------
    def _enter_stopping(self, reason: str) -> None:
        if self.phase == Phase.STOPPING:
            return
        if self.loop.child is not None and self.loop.child.poll() is None:
            if self._ask_trainer_to_stop(self.loop.child):
                reason += f"; SIGTERM sent to trainer pid {self.loop.child.pid}"
            else:  # asked already (its GPU lease lost): the save under way is waited for
                reason += f"; trainer pid {self.loop.child.pid} is saving already (asked to stop before)"
        self._go(Phase.STOPPING, reason)

    def _ask_trainer_to_stop(self, child: Child) -> bool:
        """The SIGTERM that asks the trainer to save and stop: a stop's, and a lost GPU lease's (daemon/attempt.py
        _leave_lost_gpu). Sent once to a trainer, however many ask: a stop taken while it saves for a lost lease
        waits on that save (a second SIGTERM would cut torch's agent's close short and start it again); its time
        (`stop_sent`) starts the save grace (`_kill_past_save_grace`). A Slurm step is signalled through Slurm.
        Whether it was asked now (False: asked before)."""
        if child.stop_sent is not None:
            return False
        child.stop_sent = now()
        child.stop_mark = trainerwatch.newest_mark(self.cfg)  # a save since: said at a second signal
        if not (self.slurm and self.slurm.stop_step(child.command)):  # srun: its step is signalled
            child.signal_group(signal.SIGTERM)
        return True

    def _kill_past_save_grace(self, child: Child, kind: str, why: str = "") -> None:
        """SIGKILL to a trainer asked to stop (`_ask_trainer_to_stop`) that has not exited within the save grace,
        said in a `kind` event: the one rule of how long a stop's save is waited for."""
        patience = save_grace(self.cfg)
        if child.killed_at is None and now() - (child.stop_sent or now()) > patience:
            self.events.emit(kind, f"the trainer did not exit within {patience:.0f}s of SIGTERM: SIGKILL")
            child.kill(why=f"by the supervisor: no exit within {patience:.0f}s of its SIGTERM{why}")

    def _tick_stopping(self) -> None:
        child = self.loop.child
        if child is not None:
            rc = child.poll()
            if rc is None and self.slurm and lastsynccut.reached(self.slurm, self.cfg):
                self._cut_save(child)  # the job's end is near: its save is waited for no longer
                return
            if rc is None:
                if child.killed_at is not None:
                    trainerwatch.report_unreaped(child, self.events.emit)
                self._kill_past_save_grace(child, "stop")
                return
            self._on_child_end(rc)
        if self.slurm and (cut := lastsynccut.due(self.slurm, self.sync, self.cfg, self.state, self.events.emit)):
            if self.staging.running:  # the job's end is near: nothing more is waited for
                self.events.emit("stop", f"the {self.staging.abandon()} thread is left behind: the job ends")
            self._finish(cut)  # requeued all the same, before Slurm's kill
            return
        if self.staging.running:
            if now() - (self.state.since or 0.0) < STOP_WAITS_FOR_STAGING_S:
                return  # let a half-done copy end before we exit (it would be cleaned up next time anyway)
            # a copy or fetch stalled on the remote: leave its thread behind (its temp names are cleaned next time)
            self.events.emit("stop", f"the {self.staging.abandon()} thread has not ended after "
                                     f"{STOP_WAITS_FOR_STAGING_S:.0f}s: exiting without it")
        waits = not (self.loop.stop_requested or self.room.stopping) and \
            lastsynccut.may_wait(self.slurm, self.state.since or now(),  # a Slurm job's allocation: not for ever
                                 wait_s=self.knobs.final_sync_wait_s)
        problem = self.sync.final_sync(self.staging.staged, waits, self.staging.fetched_step, self.staging.rewound)
        if problem is not None:
            self._finish(problem)
        elif self.sync.room_wait:
            self._say(self.sync.room_wait)
            self._give_gpu_back()

    def _cut_save(self, child) -> None:
        """A preempted Slurm job's trainer still saving at the job's deadline (a slow save, a torchrun group's slow
        teardown): SIGKILL its group, as after restart.hang_timeout, and finish as requeued while there is time for
        it. The save is atomic: the checkpoint before it stays."""
        assert self.slurm is not None  # only a Slurm job has a deadline
        waited = now() - (child.stop_sent or now())
        words = lastsynccut.save_cut(self.slurm, self.sync, self.cfg, self.state, waited)
        self.events.emit("stop", f"{words}: SIGKILL to trainer pid {child.pid}")
        self.state.record_error(words)
        if child.killed_at is None:
            child.kill(why="by the supervisor at the Slurm job's end, still saving")
        if (rc := wait_bounded(child.popen, SAVE_CUT_REAP_S, self.notifier.watchdog)) is not None:
            self._on_child_end(rc)  # else _shutdown says it is not reaped
        self._finish(words)

    def _finish(self, sync_problem: str) -> None:
        if self.sync.final_refusal:  # before any other end: a restart, a requeue or a wait would be refused again
            self._end_on_another_runs_remote()
            return
        if (missing := self._nothing_to_sync()) and \
                (lost := scratch_remade.lost(self.cfg.scratch_dir, scratch.held_identity(self.cfg.scratch_dir))):
            self._scratch_lost_at_end(lost)
            return
        if missing:
            self.loop.scratch_kept = f"kept {self.cfg.scratch_dir}: the trainer ended done with no " \
                                f"checkpoint in it (saved elsewhere); nothing in it is given back"
            self._fail(protocol.SUPERVISOR_GAVE_UP, missing)
            return
        if not sync_problem and self.cfg.run.remote and (dropped := self.after_sync.at_end(self._remote_step())):
            self.events.emit("sync", dropped)  # an earlier job's unsynced checkpoint, kept in run.dir: synced now
        kept = f"the checkpoint stays in {self.cfg.checkpoint_dir}"
        if self.slurm and self.cfg.scratch_is_default:  # $TMPDIR or /dev/shm of the job's node
            kept += ", this Slurm job's node-local scratch, which the job's end may wipe: the next start resumes " \
                    "from run.remote's newest"
        if self.slurm:
            self.slurm.finishing(self.cfg, sync_problem)  # frees this job's node scratch once the remote has it
            if self.slurm.preempted_by:
                self._finish_preempted(sync_problem)
                return
            if sync_problem and not self.slurm.sync_cut and not self.loop.stop_requested and not self.room.stopping:
                if self.room.removed:  # nothing kept in, nor requeued into, a run.dir removed meanwhile: 73, final
                    self._fail(protocol.SUPERVISOR_RUN_DIR_FULL, self.room.outcome(sync_problem))
                else:
                    self._finish_unsynced(sync_problem)  # kept in run.dir, requeued: never lost with the node's scratch
                return
        # a trainer that ended done (budget reached, or early_stop) has finished: a stop that came during its last
        # sync, that sync done, changes nothing (recorded "stopped", a later stage's init.from waited for ever)
        if self.loop.stop_requested and (sync_problem or self.loop.last_cause != Cause.DONE):
            if sync_problem:
                self.state.record_error(f"stopped, but {sync_problem}; {kept}")
            self.loop.ended = protocol.ENDED_STOPPED
            self._go(Phase.DONE, self.loop.stop_reason + (f" ({sync_problem})" if sync_problem else ""))
            if not self.slurm and not self.staging.running and (said := scratch_end.give_back_unsaved(
                    self.cfg.scratch_dir, self.cfg.run_dir, self.cfg.run, remote_step=self._remote_step())):
                self.events.emit("scratch", said)
        elif self.room.stopping:
            self._fail(protocol.SUPERVISOR_RUN_DIR_FULL, self.room.outcome(sync_problem))
        elif sync_problem:
            # not final: systemd restarts us, the trainer exits at once, the sync is tried again
            self._fail(protocol.SUPERVISOR_RETRY, f"finished, but {sync_problem}; {kept}")
        else:
            self.loop.ended = protocol.ENDED_FINISHED
            self._go(Phase.DONE, "the run finished" + (" and its last checkpoint is synced" if self.cfg.run.remote
                                                         else ""))
            if not self.slurm and not self.staging.running:  # a Slurm job's scratch: slurm.finishing above
                self.events.emit("scratch", scratch_end.give_back(self.cfg.scratch_dir, self.cfg.run_dir, self.cfg.run))

    def _end_on_another_runs_remote(self) -> None:
        """run.remote is another run's (SyncWorker.final_refusal): the run ends as its launch is refused, `failed`,
        exit 2 (final: neither systemd, a tmux window nor Slurm starts it again), never a last sync waiting for a claim
        whose removal would make none of that run's checkpoints this one's. Its checkpoints stay in scratch (a final
        failure gives back only the staged inputs, daemon/ending.py _release_inputs), and in a Slurm job the newest is
        kept in run.dir too (the job's end may wipe the node's scratch; the next start fetches it back). The reason
        says what to do, in a line; the log has the refusal whole (`minilmd logs`)."""
        newest = max(local_checkpoint_steps(self.cfg.checkpoint_dir), default=None)
        where = f"its newest checkpoint, step {newest}, stays in {self.cfg.checkpoint_dir / names.step_name(newest)}" \
            if newest is not None else f"scratch holds no checkpoint of it now ({self.cfg.checkpoint_dir})"
        if self.slurm and newest is not None:
            where = unsynced_end.keep_refused(self.slurm, self.cfg, self.sync, self.state, self.events.emit,
                                              self.sync.final_refusal)
            self.slurm.finishing(self.cfg, self.sync.final_refusal)  # its node scratch kept: the sync did not take it
        advice = remote_claim.own_remote_advice(str(self.config_path.absolute()), slurm=self.slurm is not None)
        self._fail(protocol.SUPERVISOR_CONFIG, f"config error, final: {self.sync.final_refusal}; {where}: {advice}")

    def _scratch_lost_at_end(self, lost: str) -> None:
        """The trainer ended done, but scratch was removed (or partly: its marker gone) before the last sync copied
        its last checkpoint (fault11 F2): before, "saved elsewhere", final (79). As after a removal while it trained,
        the run stages again (a scratch claimed afresh, run.remote's newest fetched) and trains its last steps again,
        unattended; not when a stop was asked (stopped: the next start does it), in a Slurm job, or with the sync's
        thread still hanging or a wait of the last sync's behind it (its GPU given back): failed, not final (1)."""
        again = not (self.loop.stop_requested or self.room.stopping or self.slurm or self.sync.worker is not None or
                     self.sync.waited_for_room or self.sync.claim_wait_said)
        words = scratch_removed.lost_at_end(self.cfg.scratch_dir, lost, self.state.progress.step, self._remote_step(),
                                            again)
        self.state.record_error(words)
        if again:
            self.sync.final_tries = 0  # the last sync after the steps trained again is tried afresh
            self.loop.last_cause = None  # not done yet: its last steps are to be trained again
            self.staging.forget()
            self.staging.stop_fetch.clear()  # set as the stopping phase began: the fetch from the remote is wanted
            self._go(Phase.STAGING, words)
        elif self.loop.stop_requested:
            self.loop.ended = protocol.ENDED_STOPPED
            self._go(Phase.DONE, f"{self.loop.stop_reason} ({words})")
        else:
            self._fail(protocol.SUPERVISOR_RETRY, words)

    def _nothing_to_sync(self) -> str:
        """Why a trainer that ended done (exit 0) cannot be called synced: the run has a remote, yet scratch holds no
        checkpoint (the last sync, finding none, had nothing to do) and run.remote has not the trainer's last step.
        The trainer saved somewhere the supervisor does not look (its scratch moved under a bug, a TMPDIR or
        scratch base unlike ours): a restart would resume there and end the same, so the failure is final. "" when
        the end is sound."""
        if self.loop.last_cause != Cause.DONE or not self.cfg.run.remote or \
                local_checkpoint_steps(self.cfg.checkpoint_dir):
            return ""
        step, remote = self.state.progress.step, self._remote_step()
        if step is not None and remote is not None and remote >= step:
            return ""  # its last step is on run.remote already: synced indeed
        on_remote = f"whose newest is step {remote}" if remote is not None else "which holds none of this run's"
        return (f"the trainer ended done (exit 0) at step {step}, but no checkpoint was synced: scratch holds none "
                f"in {self.cfg.checkpoint_dir}, nor has run.remote {self.cfg.run.remote} ({on_remote}) that step; "
                f"the trainer saved its checkpoints somewhere else (its attempt log in {self.run_dir / 'logs'} says "
                f"where), and a restart would end the same; scratch {self.cfg.scratch_dir} is kept")

    def _give_gpu_back(self) -> None:
        """The last sync waits (room on the remote, its owner record), maybe for days: the trainer has exited, so
        its cards go back to the server's other runs now, not at the supervisor's exit (once, said)."""
        if self.gpu.lease is None:
            return
        self.gpu.release()  # state.json's devices stay: the ones the run trained on (daemon/views/reproducible.py)
        self.events.emit("gpu", f"the last sync waits: GPU {self.state.devices} given back (the trainer has exited)")

    def _finish_preempted(self, sync_problem: str) -> None:
        """Slurm preempted the job: state.json says so first, then `scontrol requeue` (which ends this job). The
        step it names is the synced one, where the requeued job resumes."""
        assert self.slurm is not None  # only a Slurm job is preempted
        remote = self.state.remote_checkpoint
        resumes_at = remote.step if remote is not None else self.state.progress.step
        request = stoprequest.honoured(self.run_dir)  # `minilmd stop`'s (it wrote this before its signal): no requeue
        plan = self.slurm.plan(self.loop.last_cause == Cause.DONE, resumes_at, sync_problem,
                               request.words() if request else "")
        self.loop.ended, reason, problem, requeue = plan.ended, plan.reason, plan.problem, plan.requeue
        if problem:
            if sync_problem and not self.slurm.sync_cut and not self.room.stopping and not self.room.removed:
                if plan.unsynced:  # kept in run.dir and requeued, as a last sync that could not finish in the job
                    self._finish_unsynced(sync_problem, preempted=reason, ask=requeue)
                    return
                # a stop asked for, a cancel: not requeued, kept in run.dir all the same
                problem = unsynced_end.at_preemption(self.slurm, self.cfg, self.sync, self.state, self.events.emit,
                                                     problem, sync_problem)
            self._fail(protocol.SUPERVISOR_RETRY, problem)
            return
        if self.slurm.sync_cut and not requeue:  # stopped or cancelled for good: the cut is this run's last word
            self.state.record_error(f"{self.loop.ended}, but {self.slurm.sync_cut}")
        self._go(Phase.DONE, reason)
        if requeue:  # Slurm ends this job as it requeues it: its outcome is in state.json first, never left unsaid
            self.files.record_outcome(self.loop.exit_status, Phase.DONE, self.loop.ended)
        if requeue and (problem := self.slurm.requeue()) is not None:
            self.loop.exit_status = protocol.SUPERVISOR_RETRY
            self.state.record_error(problem)
            self.state.save()

    def _finish_unsynced(self, sync_problem: str, preempted: str = "", ask: bool = True) -> None:
        """A Slurm job's last sync that could not finish within the job, or failed as Slurm preempted the job
        (`preempted`, in words; daemon/slurm/unsynced_end.py): requeued, its outcome in state.json before `scontrol
        requeue` (not asked when Slurm requeues the job itself: `ask` False) as after a preemption; else failed,
        saying where."""
        assert self.slurm is not None
        end = unsynced_end.plan(self.slurm, self.cfg, self.sync, self.state, self.events.emit, sync_problem,
                                preempted, slurm_requeues=not ask)
        if not end.requeue:
            self._fail(end.exit, end.words)  # exit 79 once requeue_bound's requeues in a row are spent
            return
        self.loop.ended = protocol.ENDED_REQUEUED
        self._go(Phase.DONE, end.words)
        self.files.record_outcome(self.loop.exit_status, Phase.DONE, self.loop.ended)
        if ask and (problem := self.slurm.requeue()) is not None:
            self.loop.exit_status = protocol.SUPERVISOR_RETRY
            self.state.record_error(f"{problem}: resubmit the job; {end.words}")
            self.state.save()

    # --- the end ------------------------------------------------------------------------------------------------------
    def _shutdown(self, lock) -> None:
        child = self.loop.child
        if child is not None and child.poll() is None:
            if child.killed_at is None:
                child.kill_group(grace=save_grace(self.cfg), while_waiting=self.notifier.watchdog)
            if child.poll() is None:
                self.events.emit("kill", f"trainer pid {child.pid} is not reaped after SIGKILL (uninterruptible "
                                         f"I/O?): exiting without it", pid=child.pid)
        self.gpu.release()
        if self.loop.scratch_kept:
            self.events.emit("scratch", self.loop.scratch_kept)
        elif self.phase == Phase.FAILED and self.loop.exit_status in protocol.FINAL_EXIT_STATUSES:
            self._release_inputs()
        self.room.at_exit()
        ended = self.loop.ended if self.phase == Phase.DONE else protocol.ENDED_FAILED
        self.files.close(self.loop.exit_status, self.phase, ended)
        self.notifier.stopping()
        scratch_hold.let_go(self.cfg.scratch_dir)  # the scratch is free for the run's next supervisor
        lock.release()

    def _remote_step(self) -> int | None:
        """The newest step the run has on run.remote, as state.json knows it (kept across starts): what a launch
        that ended before a checkpoint of its own says is untouched (scratch_end.give_back_unsaved)."""
        remote = self.state.remote_checkpoint
        return remote.step if remote is not None else None

    def _release_inputs(self) -> None:
        """A final failure gives the staged inputs back to the machine (scratch_end.release_inputs): the corpus, the
        probe, init.from's copy. The corpus stays if the last staging trained from it because its source could not
        be read (Staging.from_copy), or its source cannot be reached now (its share gone since): the only copy within
        reach. A LoRA run's base stays once the run has checkpoints and it is the base they were trained on: its
        adapters need that very base (without a remote, its staged copy may be the only one); a copy of another base
        goes (daemon/jobs/lorabase.py kept_why). A scratch left with no checkpoint and nothing kept is removed whole
        (scratch_end.give_back_unsaved: a run that failed before staging left its marker alone). Not in a Slurm job
        (its scratch is the job's, removed with it) nor while the staging thread may still be writing there."""
        if self.slurm or self.staging.running:
            return
        from minilmd.probes import corpus_out_of_reach

        why = self.state.staging.from_copy
        why = f"the last staging trained from it, its source could not be read ({why})" if why else \
            (f"its source data.prepared {absent}" if (absent := corpus_out_of_reach(self.cfg)) else "")
        keep = {names.STAGED_CORPUS: f"{why}: it may be the only copy within reach"} if why else {}
        if self.cfg.lora.enabled and scratch_end.holds_checkpoints(self.cfg.scratch_dir) and \
                (base := lorabase.kept_why(self.cfg)):  # a copy of another base goes with the other inputs
            keep[INIT_DIR] = base
        if not keep and (done := scratch_end.give_back_unsaved(self.cfg.scratch_dir, self.cfg.run_dir, self.cfg.run,
                                                                "failed for good", self._remote_step())):
            self.events.emit("scratch", done)
            return
        done = scratch_end.release_inputs(self.cfg.scratch_dir, (names.STAGED_CORPUS, PROBE_DIR, INIT_DIR),
                                          self.cfg.run, keep)
        if done:
            self.events.emit("scratch", done)
