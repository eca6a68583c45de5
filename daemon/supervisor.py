"""`minilmd run`: one supervisor per run directory, one loop, one phase at a time.

    waiting_gpu -> staging -> starting -> training -> (backoff -> starting | staging | waiting_gpu)* -> stopping -> done
                                                                                         any live phase -> failed

The phases and the allowed transitions are in daemon/states.py; `_go()` is the only place that changes phase, and
it logs each change (events.jsonl, supervisor.log, stdout) and rewrites state.json. Signal handlers only record the
signal; the loop acts on it at the next tick. The long blocking jobs (staging, syncing) run in worker threads so that
a stalled NFS never freezes the loop or the trainer; the sync side (when, retries, pruning scratch) is
daemon/syncworker.py. The trainer is a child process (daemon/child.py); what to do
when it ends is daemon/policy.py. [E]'s parts (GPU admission, staging, sync, the lock) are reached through `Infra`,
a few methods that tests can replace. Torch-free.
"""
from __future__ import annotations

import os
import random
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd.daemon import child as childmod
from minilmd.daemon.child import Child, Death
from minilmd.daemon.policy import Decision, backoff_seconds, decide
from minilmd.daemon.runstate import (EventLog, MetricsTail, RunState, fmt_age, new_state, now, read_heartbeat,
                                     read_state)
from minilmd.daemon.sdnotify import Notifier
from minilmd.daemon.states import FINAL_PHASES, Phase, check_transition
from minilmd.daemon.syncworker import SyncWorker, Worker, local_checkpoint_steps
from minilmd import protocol
from minilmd.checkpoint import step_of
from minilmd.config import RunConfig, parse_duration, parse_overrides

if TYPE_CHECKING:
    from minilmd.daemon.gpu import DeviceLease, GpuAdmission

TICK_S = 0.2
"""The loop's period: how fast a death, a signal or a heartbeat is noticed."""
STATE_EVERY_S = 1.0
"""state.json is rewritten at most this often between transitions (the trainer's progress)."""
SYNC_STALLED_AFTER_S = float(os.environ.get("MINILMD_SYNC_STALLED_AFTER", "120"))
"""A sync running longer than this is shown as stalled (it keeps running in its thread)."""
STARTUP_GRACE_S = 60.0
"""Before its first heartbeat a trainer counts as hung only after max(hang_timeout, this)."""
FINAL_SYNC_TRIES = 3
"""Attempts of the last sync after the trainer finished or stopped before the supervisor gives up on it."""
STOP_WAITS_FOR_STAGING_S = 30.0
"""On stop, a staging copy or remote fetch still running is waited for this long (a stalled NFS may hold it)."""
"""Attempts of the last sync after the trainer finished or stopped before the supervisor gives up on it."""


class Infra:
    """The supervisor's calls into the GPU, staging, sync and checkpoint modules, each in one small method."""

    def open_gpu(self, cfg: RunConfig):
        """A GpuAdmission, or a sentence saying why there is no NVML."""
        from minilmd.daemon import gpu

        nvml = gpu.open_nvml_or_reason()
        if isinstance(nvml, str):
            return nvml
        return gpu.GpuAdmission(nvml, cfg.gpu, run_name=cfg.run.name)

    def stage(self, cfg: RunConfig, progress, log) -> Path:
        from minilmd.daemon import staging

        return staging.stage(cfg.data.prepared, cfg.scratch_dir, progress=progress, log=log)

    def is_final_staging_error(self, error: BaseException) -> bool:
        """True when retrying cannot help: the source is not a usable prepared corpus, or the checkpoint found
        on the remote belongs to another model/corpus."""
        from minilmd.daemon.staging import SourceInvalid
        from minilmd.checkpoint import CheckpointMismatch

        return isinstance(error, (SourceInvalid, CheckpointMismatch))

    def verify_staged(self, path: Path) -> list[str]:
        from minilmd.daemon import staging

        return staging.verify_staged(path)

    def expectation(self, cfg: RunConfig, staged: Path):
        from minilmd import checkpoint

        data_fp = tok_fp = None
        try:
            from minilmd.corpus import open_prepared

            corpus = open_prepared(staged)
            data_fp, tok_fp = corpus.data_fingerprint, corpus.tokenizer_fingerprint
        except Exception:  # noqa: BLE001 - fingerprints are an extra check; the trainer refuses bad data itself
            pass
        return checkpoint.Expectation(model=cfg.model_dict(), data_fingerprint=data_fp, tokenizer_fingerprint=tok_fp)

    def syncer(self, cfg: RunConfig, expected, log):
        from minilmd.daemon import sync

        return sync.Syncer(cfg.checkpoint_dir, cfg.run.remote, expected, cfg.sync.keep, log=log)

    def prune_local(self, root: Path, keep: int, protect: list[Path], log) -> list[Path]:
        from minilmd import checkpoint

        return checkpoint.prune(root, keep, protect=protect, log=log)


@dataclass
class Signals:
    """What the handlers saw; only the loop acts on it."""

    stop: int = 0  # count of SIGTERM/SIGINT received
    hup: bool = False


class Supervisor:
    def __init__(self, cfg: RunConfig, config_path: str, cli_overrides: list[str] | None = None,
                 infra: Infra | None = None, echo: bool = True):
        self.cfg = cfg
        self.config_path = Path(config_path)
        self.cli_overrides = list(cli_overrides or [])
        self.infra = infra or Infra()
        self.run_dir = cfg.run_dir.resolve()
        self.echo = echo
        self.signals = Signals()
        self.notifier = Notifier()
        self.rng = random.Random()
        self.phase = Phase.WAITING_GPU
        self.exit_status = 0
        self.child: Child | None = None
        self.attempt = 0
        self.stop_requested = False
        self.admission: GpuAdmission | None = None
        self.lease: DeviceLease | None = None
        self.devices_env = ""
        self.staged: Path | None = None
        self.stage_worker: Worker | None = None
        self.awaiting_remote: Path | None = None  # staged, but the remote could not be read for a resume: retrying
        self.fetch_retry_at = 0.0
        self.fetch_failures = 0
        self.fetch_started = 0.0  # set by the staging thread while it reads the remote
        self.next_poll_at = 0.0
        self.backoff_until = 0.0
        self.after_backoff = Phase.STARTING
        self.steps_at_launch = -1
        self.last_state_save = 0.0
        self.last_gpu_summary = ""
        self.finish_kind = ""  # "done" or "stop" while in STOPPING
        self.thread_logs: list[str] = []  # messages from the staging/sync threads, emitted by the loop
        self.stopping_since = 0.0

    # --- the run, from lock to exit status ------------------------------------------------------------------------
    def run(self) -> int:
        from minilmd.daemon.lock import LockHeld, RunLock

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lock = RunLock(self.run_dir)
        try:
            self.lock.acquire()
        except LockHeld as e:
            print(f"minilmd run: {e}", flush=True)
            return protocol.SUPERVISOR_CONFIG
        try:
            self._prepare_files()
        except OSError as e:
            print(f"minilmd run: cannot set up the run directory {self.run_dir}: {e}", flush=True)
            self.lock.release()
            return 1
        try:
            self._install_signal_handlers()
            self._adopt_previous_state()
            # READY before the orphan hunt: its grace can outlast systemd's start timeout
            self.notifier.ready(f"{self.cfg.run.name}: {self.phase}")
            self._kill_orphans()
            self.events.emit("start", f"supervisor pid {os.getpid()} owns {self.run_dir} (config {self.config_path})",
                             pid=os.getpid())
            self.state.save()
            while self.phase not in FINAL_PHASES:
                self._tick()
                time.sleep(TICK_S)
        except Exception as e:  # noqa: BLE001 - a supervisor bug: leave a clear trace, never an orphan trainer
            self.events.emit("crash", f"supervisor error: {type(e).__name__}: {e}", traceback=traceback.format_exc())
            if self.child and self.child.poll() is None:
                self.child.kill_group(grace=60)
            self.state.record_error(f"supervisor error: {e}")
            self.exit_status = 1
        finally:
            self._shutdown()
        return self.exit_status

    def _prepare_files(self) -> None:
        (self.run_dir / protocol.ATTEMPT_LOGS).mkdir(exist_ok=True)
        copy = self.run_dir / protocol.RUN_CONFIG_COPY
        if self.config_path.resolve() != copy.resolve():
            protocol.atomic_write_text(copy, self.config_path.read_text(encoding="utf-8"))
        self.events = EventLog(self.run_dir, echo=self.echo)
        self.metrics = MetricsTail(self.run_dir / protocol.METRICS)
        self.state = RunState(self.run_dir / protocol.STATE,
                              new_state(self.cfg.run.name, self.run_dir, str(self.config_path.resolve())))
        existing = sorted((self.run_dir / protocol.ATTEMPT_LOGS).glob("attempt-*.log"))
        if existing:
            self.attempt = int(existing[-1].stem.split("-")[1])
        self.state["sync"]["state"] = "idle" if self.cfg.run.remote else "off"
        self.sync = SyncWorker(self.cfg, self.infra, self.state, self.events.emit, self._log_from_thread,
                               self._drain_thread_logs, SYNC_STALLED_AFTER_S)

    def _install_signal_handlers(self) -> None:
        def on_stop(signum, frame):
            self.signals.stop += 1

        def on_hup(signum, frame):
            self.signals.hup = True

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)

    def _adopt_previous_state(self) -> None:
        """Keep what must survive a supervisor restart: the micro-batch the GPU fits, the restart history while
        the previous supervisor did not end (it crashed or was killed), the last remote checkpoint."""
        old = read_state(self.run_dir)
        if not old:
            return
        self.state["overrides"] = old.get("overrides") or {}
        self.state["remote_checkpoint"] = old.get("remote_checkpoint")
        if not old.get("outcome"):
            self.state["restarts"] = old.get("restarts") or []
            self.state["no_progress_streak"] = old.get("no_progress_streak") or 0
        if self.state["overrides"]:
            self.events.emit("adopt", f"keeping overrides from the previous supervisor: {self.state['overrides']}")
        self.state["previous_child"] = old.get("child")

    def _kill_orphans(self) -> None:
        """Never two trainers on one run: a trainer left by a killed supervisor is told to save and stop."""
        pids = childmod.find_orphans(self.run_dir)
        if not pids:
            return
        grace = min(parse_duration(self.cfg.restart.hang_timeout), 300.0)
        self.events.emit("orphan", f"found trainer process(es) of this run left by an earlier supervisor: {pids}; "
                                   f"SIGTERM, SIGKILL after {grace:.0f}s", pids=pids)
        childmod.terminate_orphans(pids, grace=grace)
        left = childmod.find_orphans(self.run_dir)
        if left:
            raise RuntimeError(f"orphaned trainer processes {left} survived SIGKILL; not starting a second trainer")
        self.events.emit("orphan", f"orphaned trainer processes {pids} are gone")

    # --- one tick of the loop -------------------------------------------------------------------------------------
    def _tick(self) -> None:
        self._drain_thread_logs()
        self._handle_signals()
        handler = {
            Phase.WAITING_GPU: self._tick_waiting,
            Phase.STAGING: self._tick_staging,
            Phase.STARTING: self._tick_child,
            Phase.TRAINING: self._tick_child,
            Phase.BACKOFF: self._tick_backoff,
            Phase.STOPPING: self._tick_stopping,
        }.get(self.phase)
        if handler:
            handler()
        self._read_progress()
        self.sync.tick(periodic=self.phase in (Phase.STARTING, Phase.TRAINING, Phase.BACKOFF))
        self.notifier.watchdog()
        if now() - self.last_state_save >= STATE_EVERY_S:
            self._save_state()

    def _log_from_thread(self, message: str) -> None:
        self.thread_logs.append(message)  # list.append is atomic; the loop emits it

    def _drain_thread_logs(self) -> None:
        while self.thread_logs:
            self.events.emit("info", self.thread_logs.pop(0))

    def _handle_signals(self) -> None:
        if self.signals.hup:
            self.signals.hup = False
            self.events.reopen()
            self.events.emit("signal", "SIGHUP: supervisor.log reopened")
        if self.signals.stop and not self.stop_requested:
            self.stop_requested = True
            self.events.emit("signal", "stop requested (SIGTERM/SIGINT): the trainer saves, then a last sync")
            self.notifier.stopping()
            self._enter_stopping("stop", "stop requested")
        elif self.signals.stop > 1 and self.child and self.child.poll() is None and not self.child.extra.get("killed"):
            self.child.extra["killed"] = True
            self.events.emit("signal", "second stop signal: killing the trainer now, without its save")
            self.child.signal_group(signal.SIGKILL)

    def _go(self, new: Phase, reason: str, **details) -> None:
        name = check_transition(self.phase, new)
        old, self.phase = self.phase, new
        self.state["phase"] = new.value
        self.state["since"] = now()
        self.state["reason"] = reason
        self.events.emit(name, f"{old} -> {new}: {reason}", transition=name, old=old.value, new=new.value, **details)
        self.notifier.status(f"{self.cfg.run.name}: {new} ({reason})"[:200])
        self._save_state()

    def _save_state(self) -> None:
        self.last_state_save = now()
        self.state.save()

    # --- waiting for a GPU -----------------------------------------------------------------------------------------
    def _tick_waiting(self) -> None:
        device = self.cfg.train.device
        if device == "cpu":
            self.devices_env = ""
            self._go(Phase.STAGING, "train.device = cpu: no GPU needed")
            return
        if self.admission is None:
            admission = self.infra.open_gpu(self.cfg)
            if isinstance(admission, str):
                if device == "cuda":
                    self.exit_status = protocol.SUPERVISOR_CONFIG
                    self.state.record_error(f"train.device = cuda, but {admission}")
                    self._go(Phase.FAILED, self.state["last_error"])
                    return
                self.devices_env = ""
                self._go(Phase.STAGING, f"{admission}: training on the CPU (train.device = auto)")
                return
            self.admission = admission
            self.state["gpu_wait"] = {"since": now(), "devices": []}
        if now() < self.next_poll_at:
            return
        self.next_poll_at = now() + parse_duration(self.cfg.gpu.poll_interval)
        report = self.admission.poll()
        self.state["gpu_wait"]["devices"] = report.to_dict()["devices"]
        summary = report.summary()
        if summary != self.last_gpu_summary and _without_ages(summary) != _without_ages(self.last_gpu_summary):
            self.events.emit("gpu", "waiting for a GPU:\n  " + summary.replace("\n", "\n  "))
        self.last_gpu_summary = summary
        lease = self.admission.try_acquire(self.cfg.gpu.count)
        if lease is None:
            return
        from minilmd.daemon.gpu import cuda_visible_devices

        self.lease = lease
        self.devices_env = cuda_visible_devices(lease)
        self.state["devices"] = list(lease.devices)
        waited = now() - self.state["gpu_wait"]["since"]
        self.state["gpu_wait"] = None
        self._go(Phase.STAGING, f"leased GPU(s) {lease.devices} after waiting {fmt_age(waited)}",
                 devices=list(lease.devices))

    # --- staging ----------------------------------------------------------------------------------------------------
    def _tick_staging(self) -> None:
        if self.stage_worker is None:
            staging = self.state["staging"]
            if self.awaiting_remote is not None:  # staged; only the fetch of a remote checkpoint is retried
                if now() < self.fetch_retry_at:
                    return
                staged = self.awaiting_remote
                staging.update(state="fetching", error=None, progress=None)
                self.events.emit("fetch", f"retrying the fetch of the newest checkpoint from {self.cfg.run.remote}")
                self.stage_worker = Worker("fetch", lambda: (staged, *self._fetch_job(staged)))
                return
            staging.update(state="running", since=now(), error=None, progress=None)
            self.events.emit("staging", f"staging {self.cfg.data.prepared} into {self.cfg.scratch_dir}")
            self.stage_worker = Worker("staging", self._stage_job)
            return
        if not self.stage_worker.done:
            self._flag_stalled_fetch()
            return
        worker, self.stage_worker = self.stage_worker, None
        self._drain_thread_logs()
        staging = self.state["staging"]
        if worker.error is not None:
            staging.update(state="failed", error=worker.error_text)
            self.state.record_error(f"staging failed: {worker.error_text}")
            if self.infra.is_final_staging_error(worker.error):
                kind = "checkpoint" if "Checkpoint" in type(worker.error).__name__ else "data"
                self._fail(protocol.SUPERVISOR_CONFIG if kind == "checkpoint" else protocol.EXIT_DATA,
                           f"{kind} error, final: {worker.error_text}")
                return
            streak = self.state["no_progress_streak"] + 1
            self.state["no_progress_streak"] = streak
            if streak >= self.cfg.restart.no_progress_limit:
                self._fail(protocol.SUPERVISOR_GAVE_UP, f"gave up: staging failed {streak} times in a row "
                                                         f"(restart.no_progress_limit): {worker.error_text}")
                return
            self._start_backoff(Phase.STAGING, f"staging failed: {worker.error_text}", streak)
            return
        staged, expected, fetched, fetch_error = worker.result
        if worker.name == "staging":
            staging.update(state="done", path=str(staged), error=None, finished=now())
            self.events.emit("staging", f"staged and verified: {staged} in {now() - worker.started:.1f}s")
        if fetch_error is not None:
            self._remote_unavailable(staged, fetch_error)
            return
        self.staged = staged
        if self.awaiting_remote is not None:
            self.awaiting_remote, self.fetch_failures = None, 0
            self.state["sync"].update(state="idle", error=None)
            staging.update(state="done", error=None)
        if fetched:
            self.events.emit("fetch", f"scratch held no checkpoint: fetched {fetched} from {self.cfg.run.remote}")
            # status shows it as the local checkpoint: the trainer resumes from it, though it did not save it
            self.state["local_checkpoint"] = {"step": step_of(Path(fetched)), "time": now(), "path": str(fetched),
                                              "fetched": True}
        elif self.cfg.run.remote and not local_checkpoint_steps(self.cfg.checkpoint_dir):
            self.events.emit("fetch", f"neither scratch nor {self.cfg.run.remote} holds a checkpoint: starting from "
                                      f"step 0")
        if self.cfg.run.remote:
            self.sync.ensure_syncer(expected)
        self._launch()

    def _remote_unavailable(self, staged: Path, error: str) -> None:
        """Scratch holds no checkpoint and the remote could not be read: it may hold a newer checkpoint, so never
        start from scratch; retry with backoff for as long as it takes (the remote being down is not the trainer's
        fault: no_progress_limit does not count it). Status shows "remote unavailable: ..."."""
        self.awaiting_remote = staged
        self.fetch_failures += 1
        delay = backoff_seconds(self.cfg.restart, self.fetch_failures, self.rng)
        self.fetch_retry_at = now() + delay
        message = f"remote unavailable: {error}"
        self.state["sync"].update(state="unavailable", error=message, since=now())
        self.state["staging"].update(state="waiting_remote", error=message)
        self.state.record_error(message)
        self.events.emit("fetch", f"{message}; scratch holds no checkpoint and the remote may hold one: not starting "
                                  f"from step 0; fetch try {self.fetch_failures} failed, next in {delay:.1f}s")
        self._save_state()

    def _flag_stalled_fetch(self) -> None:
        started = self.fetch_started
        if started and now() - started > SYNC_STALLED_AFTER_S and self.state["sync"].get("state") != "unavailable":
            message = f"remote unavailable: fetching from {self.cfg.run.remote} has been running for " \
                      f"{now() - started:.0f}s"
            self.state["sync"].update(state="unavailable", error=message, since=now())
            self.events.emit("fetch", f"{message}; waiting for it (not starting from step 0)")

    def _stage_job(self):
        """In the staging thread: stage the corpus, then fetch a remote checkpoint when scratch holds none."""
        def progress(*args):
            info = args[0] if len(args) == 1 else list(args)
            self.state["staging"]["progress"] = info.describe() if hasattr(info, "describe") else info

        staged = self.infra.stage(self.cfg, progress, self._log_from_thread)
        return (staged, *self._fetch_job(staged))

    def _fetch_job(self, staged: Path):
        """In a worker thread: (expectation, fetched path or None, fetch error text or None). A checkpoint of
        another model or corpus on the remote raises (final); any other failure to read the remote is returned."""
        if not self.cfg.run.remote:
            return None, None, None
        expected = self.infra.expectation(self.cfg, staged)
        if local_checkpoint_steps(self.cfg.checkpoint_dir):
            return expected, None, None
        from minilmd.checkpoint import CheckpointMismatch

        self.fetch_started = now()
        self.state["staging"]["progress"] = f"fetching the newest checkpoint from {self.cfg.run.remote}"
        try:
            syncer = self.sync.syncer or self.infra.syncer(self.cfg, expected, self._log_from_thread)
            return expected, syncer.fetch_latest(self.cfg.checkpoint_dir), None
        except CheckpointMismatch:
            raise
        except Exception as e:  # noqa: BLE001 - an unreachable/failing remote: retried by the loop
            return expected, None, f"{type(e).__name__}: {e}"
        finally:
            self.fetch_started = 0.0

    # --- the child ---------------------------------------------------------------------------------------------------
    def _launch(self) -> None:
        """STAGING or BACKOFF -> STARTING: a new attempt of the trainer."""
        self.attempt += 1
        overrides = {"data.prepared": str(self.staged), **self.state["overrides"]}
        for section, values in parse_overrides(self.cli_overrides).items():
            for key, value in values.items():
                overrides.setdefault(f"{section}.{key}", value)
        nproc = self.cfg.gpu.count if self.lease is not None else 1
        command = childmod.build_command(self.run_dir / protocol.RUN_CONFIG_COPY, overrides, nproc)
        self.steps_at_launch = max(local_checkpoint_steps(self.cfg.checkpoint_dir), default=-1)
        (self.run_dir / protocol.FAULT).unlink(missing_ok=True)
        self.child = childmod.launch(command, self.run_dir, self.attempt, self.devices_env)
        self.state["child"] = {"pid": self.child.pid, "start_ticks": self.child.start_ticks, "attempt": self.attempt,
                               "started": self.child.started, "log": str(self.child.log_path), "command": command}
        self._go(Phase.STARTING, f"attempt {self.attempt}: trainer pid {self.child.pid} "
                                 f"(log {self.child.log_path.relative_to(self.run_dir)})",
                 pid=self.child.pid, attempt=self.attempt)

    def _tick_child(self) -> None:
        child = self.child
        assert child is not None  # STARTING and TRAINING have one
        rc = child.poll()
        if rc is not None:
            self._on_child_end(rc)
            return
        beat = read_heartbeat(self.run_dir)
        if beat is not None and beat[0] < child.started - 1:
            beat = None  # from an earlier attempt
        if self.phase == Phase.STARTING and beat is not None:
            self._go(Phase.TRAINING, f"first heartbeat from attempt {self.attempt} (step {beat[1]})")
        child.track_cgroup()
        last_sign = max(child.started, beat[0] if beat is not None else 0.0)
        hang_timeout = parse_duration(self.cfg.restart.hang_timeout)
        if beat is None:  # imports, corpus open and checkpoint load come before the first step
            hang_timeout = max(hang_timeout, STARTUP_GRACE_S)
        if now() - last_sign > hang_timeout:
            detail = f"no heartbeat for {now() - last_sign:.0f}s (restart.hang_timeout {hang_timeout:.0f}s)"
            self.events.emit("hang", f"trainer pid {child.pid} looks hung: {detail}; dumping its stack")
            dumped = childmod.dump_stack(child.pid, child.log_path, torchrun="torch.distributed.run" in child.command)
            child.killed_for_hang = True
            child.extra["hang_detail"] = f"{detail}; {dumped}"
            child.signal_group(signal.SIGKILL)
            self._on_child_end(child.popen.wait())

    def _on_child_end(self, rc: int) -> None:
        child = self.child
        assert child is not None  # it has just ended
        self._read_progress()
        death = childmod.classify(child, rc, self.run_dir, self.stop_requested)
        self.child = None
        self.state["child"] = None
        made_progress = max(local_checkpoint_steps(self.cfg.checkpoint_dir), default=-1) > self.steps_at_launch
        step = self.state["progress"]["step"]
        self.events.emit("child_exit", f"attempt {child.attempt} (pid {child.pid}) ended: {death.cause} "
                                       f"(exit {rc}): {death.detail}", cause=death.cause, exit=rc, step=step)
        if self.phase == Phase.STOPPING:
            return  # _tick_stopping goes on with the last sync
        streak = 0 if made_progress else self.state["no_progress_streak"] + 1
        facts = self._facts_for(death)
        decision = decide(death, restart=self.cfg.restart, restarts_so_far=len(self.state["restarts"]),
                          no_progress_streak=streak, stop_requested=self.stop_requested,
                          micro_batch_size=self._effective("micro_batch_size"),
                          grad_accum=self._effective("grad_accum"), **facts)
        self._act(death, decision, streak, step)

    def _facts_for(self, death: Death) -> dict:
        facts = {}
        if death.cause in ("sigbus", "data_error") and self.staged is not None:
            try:
                problems = self.infra.verify_staged(self.staged)
            except OSError as e:  # unreadable is damaged
                problems = [f"{self.staged}: {e}"]
            facts["staged_damaged"] = bool(problems)
            if problems:
                self.events.emit("staging", f"the staged corpus fails verification: {'; '.join(problems[:3])}")
        if death.cause == "cuda_oom" and self.admission is not None and self.lease is not None:
            report = self.admission.poll()
            ours = set(self.lease.devices)
            busy = [d for d in report.devices if d.index in ours and d.foreign_processes]
            facts["gpu_busy"] = bool(busy)
        return facts

    def _effective(self, key: str) -> int:
        return int(self.state["overrides"].get(f"train.{key}", getattr(self.cfg.train, key)))

    def _act(self, death: Death, decision: Decision, streak: int, step) -> None:
        if decision.action == "finish":
            self._enter_stopping("done", "the trainer finished: last sync")
            return
        if decision.action == "stop":
            self._enter_stopping("stop", decision.message)
            return
        if decision.counts_as_restart:
            self.state["no_progress_streak"] = streak
        if decision.action == "fail":
            assert decision.exit_status is not None  # policy.decide sets it for "fail"
            self._fail(decision.exit_status, decision.message)
            return
        if decision.overrides:
            self.state["overrides"].update(decision.overrides)
            self.events.emit("overrides", decision.message, overrides=decision.overrides)
        next_phase = {"restart": Phase.STARTING, "restage": Phase.STAGING, "wait_gpu": Phase.WAITING_GPU}[
            decision.action]
        if next_phase == Phase.STAGING:
            self.staged = None
        if next_phase == Phase.WAITING_GPU and self.lease is not None:
            self.lease.release()
            self.lease = None
            self.state["devices"] = []
        delay = backoff_seconds(self.cfg.restart, max(1, streak), self.rng)
        self.state["restarts"].append({"time": now(), "attempt": self.attempt, "cause": death.cause,
                                       "exit": death.exit, "step": step, "detail": death.detail,
                                       "action": decision.action, "delay_s": round(delay, 2)})
        self.state.record_error(f"{death.cause}: {death.detail}")
        self._start_backoff(next_phase, decision.message, streak, delay)

    def _start_backoff(self, after: Phase, reason: str, streak: int, delay: float | None = None) -> float:
        if delay is None:
            delay = backoff_seconds(self.cfg.restart, max(1, streak), self.rng)
        self.backoff_until = now() + delay
        self.after_backoff = after
        self._go(Phase.BACKOFF, f"{reason}; next: {after} in {delay:.1f}s", delay_s=round(delay, 2))
        return delay

    def _tick_backoff(self) -> None:
        if now() < self.backoff_until:
            return
        after = self.after_backoff
        if after == Phase.STARTING:
            if self.staged is None or not (self.staged / "meta.json").is_file():
                self.staged = None
                self._go(Phase.STAGING, "the staged corpus is missing from scratch")
                return
            if self.cfg.run.remote and self.state["remote_checkpoint"] and \
                    not local_checkpoint_steps(self.cfg.checkpoint_dir):
                # the trainer would start from step 0: fetch the synced checkpoint first (staging reuses the copy)
                self._go(Phase.STAGING, "scratch lost its checkpoints: fetching the newest from the remote")
                return
            self._launch()
        elif after == Phase.STAGING:
            self._go(Phase.STAGING, "re-staging")
        else:
            self.admission = None
            self._go(Phase.WAITING_GPU, "waiting for a free GPU again")

    def _fail(self, status: int, message: str) -> None:
        self.exit_status = status
        self.state.record_error(message)
        self._go(Phase.FAILED, message, exit=status)

    # --- stopping and the last sync -----------------------------------------------------------------------------
    def _enter_stopping(self, kind: str, reason: str) -> None:
        if self.phase == Phase.STOPPING:
            if kind == "stop":
                self.finish_kind = "stop"
            return
        self.finish_kind = kind
        self.stopping_since = now()
        self.sync.final_tries = 0
        if self.child is not None and self.child.poll() is None:
            self.child.stop_sent = now()
            self.child.signal_group(signal.SIGTERM)
            reason += f"; SIGTERM sent to trainer pid {self.child.pid}"
        self._go(Phase.STOPPING, reason)

    def _tick_stopping(self) -> None:
        if self.child is not None:
            rc = self.child.poll()
            if rc is None:
                patience = parse_duration(self.cfg.restart.hang_timeout)
                if now() - (self.child.stop_sent or now()) > patience and not self.child.extra.get("killed"):
                    self.child.extra["killed"] = True
                    self.events.emit("stop", f"the trainer did not exit within {patience:.0f}s of SIGTERM: SIGKILL")
                    self.child.signal_group(signal.SIGKILL)
                return
            self._on_child_end(rc)
        if self.stage_worker is not None and not self.stage_worker.done:
            if now() - self.stopping_since < STOP_WAITS_FOR_STAGING_S:
                return  # let a half-done copy end before we exit (it would be cleaned up next time anyway)
            # a copy or fetch stalled on the remote: leave its thread behind (its temp names are cleaned next time)
            self.events.emit("stop", f"the {self.stage_worker.name} thread has not ended after "
                                     f"{STOP_WAITS_FOR_STAGING_S:.0f}s: exiting without it")
            self.stage_worker = None
        newest = max(local_checkpoint_steps(self.cfg.checkpoint_dir), default=None)
        if not self.cfg.run.remote or newest is None:
            self._finish("")
            return
        sync = self.sync
        if sync.syncer is None:
            try:
                expected = self.infra.expectation(self.cfg, self.staged) if self.staged else None
                sync.syncer = self.infra.syncer(self.cfg, expected, self._log_from_thread)
            except Exception as e:  # noqa: BLE001 - a bad remote: finish without the final sync, saying why
                self._finish(f"no sync possible: {type(e).__name__}: {e}")
                return
        if sync.running:
            if sync.running_for() > 2 * SYNC_STALLED_AFTER_S:
                self._finish(f"the last sync stalled ({sync.running_for():.0f}s)")
            return  # sync.tick() collects it
        if sync.final_tries > 0 and self.state["sync"]["state"] == "ok":
            self._finish("")
            return
        if sync.final_tries >= FINAL_SYNC_TRIES:
            self._finish(f"the last sync failed {sync.final_tries} times: {self.state['sync']['error']}")
            return
        if now() >= sync.next_at or sync.final_tries == 0:
            sync.final_tries += 1
            sync.start(f"last sync (try {sync.final_tries}/{FINAL_SYNC_TRIES})")

    def _finish(self, sync_problem: str) -> None:
        if self.finish_kind == "done":
            if sync_problem:
                # exit 1, not final: systemd restarts us, the trainer exits at once, the sync is tried again
                self.exit_status = 1
                self.state.record_error(f"finished, but {sync_problem}; the checkpoint stays in "
                                        f"{self.cfg.checkpoint_dir}")
                self._go(Phase.FAILED, self.state["last_error"], exit=1)
                return
            self._go(Phase.DONE, "the run finished" + (" and its last checkpoint is synced" if self.cfg.run.remote
                                                         else ""))
            return
        if sync_problem:
            self.state.record_error(f"stopped, but {sync_problem}; the checkpoint stays in "
                                    f"{self.cfg.checkpoint_dir}")
        self._go(Phase.DONE, "stopped on request" + (f" ({sync_problem})" if sync_problem else ""))

    # --- the trainer's progress -------------------------------------------------------------------------------------
    def _read_progress(self) -> None:
        progress = self.state["progress"]
        for rec in self.metrics.read_new():
            kind = rec.get("kind")
            if kind == "train":
                for key in ("step", "total_steps", "loss", "lr", "tokens_seen"):
                    if rec.get(key) is not None:
                        progress[key] = rec[key]
                progress["tok_s"] = rec.get("tok_s")
                step_time = rec.get("step_time")
                if step_time and progress.get("total_steps") and progress.get("step") is not None:
                    progress["eta_s"] = max(0, progress["total_steps"] - progress["step"]) * step_time
                progress["updated"] = rec.get("time") or now()
            elif kind == "eval":
                progress["val_loss"] = rec.get("val_loss")
            elif kind == "checkpoint":
                self.state["local_checkpoint"] = {"step": rec.get("step"), "time": rec.get("time") or now(),
                                                  "path": rec.get("path"), "blocking_s": rec.get("blocking_s")}
        beat = read_heartbeat(self.run_dir)
        if beat is not None:
            progress["heartbeat"] = beat[0]
            if beat[1] is not None and (progress.get("step") is None or beat[1] > progress["step"]):
                progress["step"] = beat[1]

    # --- the end ------------------------------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.kill_group(grace=30)
        if self.lease is not None:
            self.lease.release()
        self.state["outcome"] = {"exit": self.exit_status, "phase": self.phase.value, "time": now(),
                                 "reason": self.state["reason"]}
        self.state.save()
        self.events.emit("exit", f"supervisor exits with status {self.exit_status} ({self.phase})",
                         exit=self.exit_status)
        self.events.close()
        self.notifier.stopping()
        self.lock.release()


def _without_ages(summary: str) -> str:
    """A GPU summary without its durations, to log a change of who is busy rather than every poll."""
    import re

    return re.sub(r"\(\d+[smh]\S*\)|for \d+\S*", "", summary)


def run_supervisor(config_path: str, overrides: list[str] | None = None) -> int:
    """`minilmd run CONFIG`: load, validate (exit 2 on problems), supervise until done/failed/stopped."""
    from minilmd.config import ConfigError, load_config

    try:
        cfg = load_config(config_path, overrides)
    except ConfigError as e:
        print(f"minilmd run: {e}", flush=True)
        return protocol.SUPERVISOR_CONFIG
    return Supervisor(cfg, config_path, overrides).run()
