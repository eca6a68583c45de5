"""The launch's wait for room for scratch (daemon/scratchclaim.py) in state.json: phase `waiting_scratch`, its reason
(which place, how full, whose entries fill it), this process as the run's supervisor, so that `minilmd status` shows
the wait, not the previous supervisor's record (before, it did: "not running", or "done" of a run that was waiting).

Written the one way state.json is (RunState.save: atomic, a full run.dir no error), over the previous supervisor's
record and still readable as it: what a later start reads of a state.json (the supervisor's adopt: overrides, notes,
the remote checkpoint, the restart history, the trainer it ran; runidentity, rundone and remotewait: the checkpoints
and the staged corpus's path; `run --check`'s measured rate: progress) is that record's, unchanged, so a wait that
is killed makes no later start forget anything (a stopped one ends the record as a supervisor's stop does). What was
the previous supervisor's alone is not shown as this one's: its end (outcome; and with it its restart history and
last error, which adopt would not carry either), its trainer (child: kept as previous_child, which adopt reads of a
record that ran none: runstate.passed_on_child), its waits, devices, Slurm job and textfile. A previous state.json
that cannot be read is left as it is: the supervisor must find it and say so (its remote step is then unknown:
daemon/jobs/remotewait.py); the wait shows in the run lock's holder and its log only.

The wait's end: a stop writes `done` (ended stopped, exit 0, nothing started), a Slurm preemption `done` as a
preempted supervisor's end, a failure `failed` with its exit status, as a supervisor's end does (`minilmd stop`
reports it); room again writes nothing: the supervisor's start, handed the run lock, replaces the record
(states.check_start `waited`). Its start, that end or `scratch_made` are logged in events.jsonl and supervisor.log as
the supervisor logs its transitions (`minilmd logs` shows them). Torch-free.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

from minilmd import names, protocol
from minilmd.config import RunConfig
from minilmd.daemon.base.runstate import EventLog, RunState, load_state, new_state, now, passed_on_child
from minilmd.daemon.base.states import Phase, check_transition
from minilmd.daemon.base.statesections import Outcome, StateJson
from minilmd.daemon.host import sdnotify
from minilmd.untrusted import Unreadable


def _open_log(run_dir: Path) -> EventLog | None:
    """The run's events.jsonl and supervisor.log, for the wait's transitions; None when supervisor.log cannot be
    opened (a full run.dir: the wait goes on unlogged, as the supervisor's writes fail quietly)."""
    try:
        return EventLog(run_dir, echo=False)  # the launch says its own words on its output
    except OSError:
        return None


BEAT_S = 20.0
"""How often the waiting record is re-saved at least: well within initwait.STALE_S (60 s)."""


class WaitRecord:
    """state.json while the launch waits for scratch; `state` None when the previous one cannot be read (left)."""

    def __init__(self, cfg: RunConfig, config_path: str):
        self.state: RunState | None = None
        self._saved = 0.0
        self.events = _open_log(cfg.run_dir)  # logged even when the record is left (unreadable)
        self._logged = False
        try:
            old = load_state(cfg.run_dir)
        except Unreadable as e:
            if not e.missing:
                return
            old = None
        ours = StateJson.from_dict(new_state(cfg.run.name, cfg.run_dir, str(Path(config_path).resolve())))
        state = RunState(cfg.run_dir / names.STATE, old if old is not None else ours.to_dict())
        state.run, state.run_dir, state.config, state.supervisor = ours.run, ours.run_dir, ours.config, ours.supervisor
        if unit := sdnotify.own_unit():  # for `stop`, as the supervisor's: systemd's restart reads no stop request
            state.supervisor.systemd_unit, state.supervisor.systemd_user = unit
        state.previous_child, state.adopted = passed_on_child(old or {}), True
        if state.outcome is not None:  # an ended supervisor's history, which adopt would not carry on either
            state.count_restarts_anew(now())
            state.last_error = state.last_error_at = state.last_error_step = None
        state.outcome, state.child, state.devices = None, None, []
        state.gpu_wait = state.init_wait = state.space_wait = state.slurm = state.prometheus = None  # its, not ours
        state.phase, state.since = Phase.WAITING_SCRATCH, now()  # a launch's start (states.LAUNCH_PHASES)
        self.state = state

    def waiting(self, why: str) -> None:
        """The wait goes on, for `why` now (its place, how full, whose entries)."""
        if self.events is not None and not self._logged:
            self._logged = True
            self.events.emit(Phase.WAITING_SCRATCH, f"the launch waits: {why}", phase=Phase.WAITING_SCRATCH)
        if self.state is not None:
            self.state.reason = why
            self._save()

    def made(self, words: str) -> None:
        """Room again, scratch made: logged as the `scratch_made` edge (the supervisor's start says its phase)."""
        self._log("scratch_made", f"{Phase.WAITING_SCRATCH} -> the supervisor's start: {words}")

    def reopen_log(self) -> None:
        """SIGHUP: supervisor.log reopened (logrotate moved it), as the supervisor does."""
        if self.events is not None:
            with contextlib.suppress(OSError):
                self.events.reopen()
                self.events.emit("signal", "SIGHUP: supervisor.log reopened (waiting for room for scratch)")

    def _save(self) -> None:
        assert self.state is not None
        self._saved = time.monotonic()
        self.state.save()

    def alive(self) -> None:
        """The wait goes on: state.json re-saved once BEAT_S has passed since it was last, so that a reader that
        calls an old state.json a dead run's (daemon/phases/initwait.py STALE_S) finds it fresh (review10a F3)."""
        if self.state is not None and time.monotonic() - self._saved >= BEAT_S:
            self._save()

    def preempted(self, ended: str, status: int, why: str) -> None:
        """Slurm preempted the job during the wait (daemon/scratchclaim.py, its SlurmJob made on this record has
        written its `slurm` section): `done` as a preempted supervisor's end (`ended`: requeued, stopped,
        cancelled), `status` 1 when the requeue failed."""
        if self.state is not None and status:
            self.state.record_error(why)
        self._end(Phase.DONE, status, why, ended)

    def stopped(self, why: str) -> None:
        """A stop ended the wait: nothing started, exit 0."""
        self._end(Phase.DONE, protocol.SUPERVISOR_DONE, why, protocol.ENDED_STOPPED)

    def failed(self, status: int, why: str) -> None:
        """The wait ended on a refusal or an error (`status`: the launch's exit status)."""
        if self.state is not None:
            self.state.record_error(why)
        self._end(Phase.FAILED, status, why, protocol.ENDED_FAILED)

    def _log(self, name: str, message: str, **details) -> None:
        """A transition of the wait in events.jsonl and supervisor.log (the supervisor's `_go` logs its own so),
        the log closed after it: the supervisor opens its own."""
        if self.events is not None:
            self.events.emit(name, message, transition=name, old=Phase.WAITING_SCRATCH, **details)
            self.events.close()
            self.events = None

    def _end(self, phase: Phase, status: int, why: str, ended: str) -> None:
        name = check_transition(Phase.WAITING_SCRATCH, phase)
        self._log(name, f"{Phase.WAITING_SCRATCH} -> {phase}: {why}", new=phase, exit=status)
        if self.state is None:
            return
        self.state.phase, self.state.since, self.state.reason = phase, now(), why
        self.state.outcome = Outcome(exit=status, phase=phase, time=now(), reason=why, ended=ended)
        self._save()
