"""One attempt of the trainer: its launch, its watch at each tick, its end and the action policy.py decides on it.

The `Supervisor`'s own methods (daemon/supervisor.py), kept here as a mixin as daemon/ending.py keeps the ending, so
that the loop's phases and the life of one child read apart: `_launch` (STAGING, BACKOFF or WAITING_SPACE ->
STARTING), `_tick_child` (STARTING and TRAINING: the first heartbeat, the hang watch, the end polled), `_on_child_end`
(the death classified, daemon/child/policy.py's decision) and `_act` on it. The phase still changes through the loop's
`_go()` alone. Torch-free.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minilmd import names, protocol
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.config import RunConfig
from minilmd.daemon.base.runstate import EventLog, RunState, now, read_heartbeat
from minilmd.daemon.base.states import FIRST_HEARTBEAT, Action, Cause, Phase
from minilmd.daemon.base.statesections import Restart
from minilmd.daemon.child import process as childmod
from minilmd.daemon.child import trainerwatch
from minilmd.daemon.child.death import Death, classify
from minilmd.daemon.child.grace import torchrun_grace_env
from minilmd.daemon.child.policy import Decision, backoff_seconds, decide
from minilmd.daemon.host.sdnotify import Notifier
from minilmd.daemon.infra import Infra
from minilmd.daemon.jobs.stagingworker import StagingWorker
from minilmd.daemon.jobs.syncworker import SyncWorker
from minilmd.daemon.loopstate import SupervisorState
from minilmd.daemon.phases.gpuwait import GpuWaiter
from minilmd.daemon.phases.rundirwatch import RunDirWatch
from minilmd.daemon.runfiles import RunFiles
from minilmd.daemon.slurm.job import SlurmJob
from minilmd.fsio import is_disk_full
from minilmd.roomwords import made_in, no_room, top_of
from minilmd.untrusted import printable


class Attempt:
    """A trainer's launch, watch and end: the `Supervisor`'s methods for them (a mixin)."""

    loop: SupervisorState  # what the loop holds beyond state.json (daemon/loopstate.py): the child, its attempt
    # the supervisor's own, set by Supervisor.__init__ and its parts, made by Supervisor.run (daemon/supervisor.py)
    cfg: RunConfig
    run_dir: Path
    cli_sets: dict[str, dict[str, Any]]
    infra: Infra
    rng: random.Random
    files: RunFiles
    events: EventLog
    state: RunState
    room: RunDirWatch
    gpu: GpuWaiter
    staging: StagingWorker
    sync: SyncWorker
    slurm: SlurmJob | None
    notifier: Notifier

    if TYPE_CHECKING:  # the loop's own (daemon/supervisor.py) and the ending's (daemon/ending.py)
        @property
        def phase(self) -> Phase: ...

        def _go(self, new: Phase, reason: str, **details) -> None: ...

        def _fail(self, status: int, message: str) -> None: ...

        def _restarted(self, at_start: bool = False) -> None: ...

        def _start_backoff(self, after: Phase, reason: str, streak: int, delay: float | None = None) -> None: ...

        def _wait_for_space(self, fault: dict | None, message: str) -> None: ...

        def _enter_stopping(self, reason: str) -> None: ...

        def _ask_trainer_to_stop(self, child: childmod.Child) -> bool: ...

        def _kill_past_save_grace(self, child: childmod.Child, kind: str, why: str = "") -> None: ...

    def _launch(self) -> None:
        """STAGING, BACKOFF or WAITING_SPACE -> STARTING: a new attempt of the trainer; -> WAITING_GPU instead when
        a card's lease was lost to another run meanwhile (GpuWaiter.lost): no trainer launched on its card."""
        if self.gpu.lost:
            lost = self.gpu.lost
            self.gpu.release()
            self.state.devices = []
            self._go(Phase.WAITING_GPU, f"{lost}; no trainer is launched on that GPU: waiting for a free GPU again")
            return
        if self.room.still_full(self.phase):
            self._enter_stopping(self.room.stop(f"attempt {self.loop.attempt + 1} cannot start"))
            return
        if refused := self.staging.reclaim():  # scratch is claimed again before every trainer start
            return self._fail(protocol.SUPERVISOR_CONFIG, f"config error, final: {refused}")
        self.loop.attempt += 1
        nproc, devices = (self.slurm.nproc, self.slurm.devices_env) if self.slurm else \
            (self.gpu.nproc, self.gpu.devices_env)
        sets = {**self.staging.inputs_for(self.slurm), **self.state.overrides}  # + the staged probe, init.from
        command = trainerwatch.attempt_command(self.run_dir, self.staging.staged, self.cfg.scratch_dir, sets,
                                               self.cli_sets, nproc)
        if self.slurm:
            command = self.slurm.command(command, self.loop.attempt, self.cfg, self.staging.staged)
        newest = max(local_checkpoint_steps(self.cfg.checkpoint_dir), default=-1)
        (self.run_dir / names.FAULT).unlink(missing_ok=True)
        try:
            self.loop.child = self.infra.launch(command, self.run_dir, self.loop.attempt, devices,
                                           compile_cache=trainerwatch.compile_cache_root(self.cfg),
                                           extra_env={**names.determinism_env(self.cfg.train.deterministic),
                                                      **torchrun_grace_env(self.cfg),  # a torchrun's ranks' too
                                                      **(self.slurm.launch_env if self.slurm else {})})
        except OSError as e:
            if not is_disk_full(e):
                raise
            if made_in(e, self.cfg.scratch_dir):  # its compile caches: scratch is full, not run.dir (73, final)
                self._wait_for_space(None, f"scratch full: attempt {self.loop.attempt} cannot make its compile "
                                           f"caches: {no_room(e, self.cfg.scratch_dir, top_of(self.cfg.scratch_dir))}")
                return
            self._enter_stopping(self.room.stop(f"attempt {self.loop.attempt} cannot write its log", error=e))
            return
        trainerwatch.launched(self.loop.child, self.cfg, newest)
        self.sync.trainer_launched = True  # its saves are what the last sync pushes (lastsyncrule.py)
        self._restarted()  # the earlier trainer's rate is no ETA for this one
        self.state.child = trainerwatch.child_info(self.loop.child, command)  # its saves past `newest` reset the streak
        self._go(Phase.STARTING, f"attempt {self.loop.attempt}: trainer pid {self.loop.child.pid} "
                                 f"(log {self.loop.child.log_path.relative_to(self.run_dir)})",
                 pid=self.loop.child.pid, attempt=self.loop.attempt)

    def _tick_child(self) -> None:
        child = self.loop.child
        assert child is not None  # STARTING and TRAINING have one
        rc = child.poll()
        if rc is not None:
            self._on_child_end(rc)
            return
        if child.killed_at is not None:
            trainerwatch.report_unreaped(child, self.events.emit)
            return
        beat = read_heartbeat(self.run_dir)  # once a tick: the hang watch judges its mtime and phase together
        if self.phase == Phase.STARTING and beat is not None and child.beats(beat):
            self._go(Phase.TRAINING, f"{FIRST_HEARTBEAT} {self.loop.attempt} (step {beat.step})")
        child.track_cgroup()
        trainerwatch.kill_if_hung(self.cfg, child, beat, self.events.emit)  # the next ticks poll for its end

    def _leave_lost_gpu(self) -> None:
        """While a trainer runs (STARTING, TRAINING) on cards one of whose leases another run holds now (GpuWaiter.lost,
        found by two keeps in a row): by the admission's rule this run would not be admitted to that card now, and the
        other run will train there (it was admitted when the card looked idle: this run staging, or between two
        trainers). So this run does not share it: the trainer is asked to save and stop, by the SIGTERM a stop sends
        (ending.py _ask_trainer_to_stop; SIGKILL past the save grace, as a stop's), and its end goes back to
        waiting_gpu (policy.decide's gpu_lost), where the card is busy, "leased by run R", until that run lets it go.
        Said in a `gpu` event; the keep said the loss as the run's last error already. With no trainer running,
        `_launch` goes to waiting_gpu instead."""
        child = self.loop.child
        if self.phase not in (Phase.STARTING, Phase.TRAINING) or child is None or child.poll() is not None:
            return
        if not self.loop.gpu_lost:
            if not self.gpu.lost:
                return
            self.loop.gpu_lost = self.gpu.lost
            self._ask_trainer_to_stop(child)
            self.events.emit("gpu", f"{self.gpu.lost}; so as not to share that GPU, SIGTERM sent to trainer pid "
                                    f"{child.pid} (it saves, then stops), and the run waits for a free GPU again")
        else:
            self._kill_past_save_grace(child, "gpu", " (its GPU lease lost)")

    def _on_child_end(self, rc: int) -> None:
        child = self.loop.child
        assert child is not None  # it has just ended
        self.files.read_progress()
        death = classify(child, rc, self.run_dir, self.loop.stop_requested)
        self.loop.last_cause = death.cause
        self.loop.child = None
        self.state.child = None
        gpu_lost, self.loop.gpu_lost = self.loop.gpu_lost, ""  # this trainer's: never the next one's, whatever path
        # torchrun's workers outlive an agent killed alone: never beside the next one, so waited for (bounded)
        left, survived = child.kill_rest_and_wait(while_waiting=self.notifier.watchdog)
        if left:
            self.events.emit("kill", f"attempt {child.attempt}'s trainer pid {child.pid} ended, its processes {left} "
                                     f"had not: SIGKILL", pids=left)
        if survived:  # stuck in the kernel: a rank 0 among them still holds trainer.lock, and the next one exits 69
            said = (f"attempt {child.attempt}'s processes {survived} survived SIGKILL for {childmod.REAP_S:.0f}s; "
                    "the next attempt starts after the backoff, refused and retried while they hold the scratch")
            self.events.emit("kill", said, pids=survived)
            death = Death(death.cause, death.exit, f"{death.detail}; {said}", death.fault)
        made_progress = trainerwatch.made_progress(self.cfg, child)
        step = self.state.progress.step
        self.events.emit("child_exit", f"attempt {child.attempt} (pid {child.pid}) ended: {death.cause} "
                                       f"(exit {rc}): {death.detail}", cause=death.cause, exit=rc, step=step)
        if self.phase == Phase.STOPPING:
            return  # _tick_stopping goes on with the last sync
        if self.room.still_full(self.phase, death.cause) and not self.loop.stop_requested:
            self.state.record_error(f"{death.cause}: {death.detail}")
            self._enter_stopping(self.room.stop(f"the trainer ended ({death.cause})"))
            return
        streak = 0 if made_progress else self.state.no_progress_streak + 1
        death = on_another_node(death)
        decision = decide(death, restart=self.cfg.restart, restarts_so_far=len(self.state.restarts),
                          no_progress_streak=streak, stop_requested=self.loop.stop_requested, gpu_lost=gpu_lost,
                          micro_batch_size=self._effective("micro_batch_size"),
                          grad_accum=self._effective("grad_accum"),
                          **trainerwatch.death_facts(death, child, self.cfg, self.state, self.staging, self.gpu,
                                                     self.events.emit))
        self._act(death, decision, streak, step)

    def _effective(self, key: str) -> int:
        return int(self.state.overrides.get(f"train.{key}", getattr(self.cfg.train, key)))

    def _act(self, death: Death, decision: Decision, streak: int, step) -> None:
        if decision.action == Action.FINISH:
            self._enter_stopping("the trainer finished: last sync")
            return
        if decision.action == Action.STOP:
            self._enter_stopping(decision.message)
            return
        if decision.action == Action.WAIT_SPACE:
            self._wait_for_space(death.fault, decision.message)
            return
        if decision.counts_as_restart:
            self.state.no_progress_streak = streak
        if decision.action == Action.FAIL:
            assert decision.exit_status is not None  # policy.decide gives every FAIL its status
            self._fail(decision.exit_status, decision.message)
            return
        if decision.overrides:
            self.state.overrides.update(decision.overrides)
            self.events.emit("overrides", decision.message, overrides=decision.overrides)
            self.staging.record_shape_change(staged=False)  # the relaunch resumes its newest checkpoint with them
        next_phase = {Action.RESTART: Phase.STARTING, Action.RESTAGE: Phase.STAGING,
                      Action.WAIT_GPU: Phase.WAITING_GPU}[decision.action]
        if next_phase == Phase.STAGING:
            self.staging.forget()
        if next_phase == Phase.WAITING_GPU:
            self.gpu.release()
            self.state.devices = []
        delay = backoff_seconds(self.cfg.restart, max(1, streak), self.rng)
        self.state.restarts.append(Restart(time=now(), attempt=self.loop.attempt, cause=death.cause, exit=death.exit,
                                           step=step, detail=death.detail, action=decision.action,
                                           delay_s=round(delay, 2)))
        self.state.record_error(f"{death.cause}: {death.detail}")
        self._start_backoff(next_phase, decision.message, streak, delay)


def on_another_node(death: Death) -> Death:
    """A trainer's scratch_full (exit 74) from another node's scratch, as its fault.json's `host` says (a node's
    local rank 0 takes its own scratch's lock): the wait for room measures this node's scratch only, finds room and
    relaunched at once, uncounted, for as long as the other node stayed full (review11a F2b). So it is a crash for
    the restart policy: counted by restart.max_restarts, relaunched after the backoff. A fault with no host (an
    older trainer's) or this host's is waited for as before."""
    host = (death.fault or {}).get("host")
    if death.cause != Cause.SCRATCH_FULL or not isinstance(host, str) or host == socket.gethostname():
        return death
    return Death(Cause.CRASH, death.exit, f"{death.detail} (on node {printable(host)}, not this one: its scratch "
                                          f"cannot be measured from here, so restarted after the backoff, counted)",
                 death.fault)
