"""What the supervisor writes in its run directory and publishes beyond it: the copy of the config, events.jsonl
and supervisor.log, state.json, the tail of the trainer's metrics.jsonl, the Prometheus textfile ([log]
prometheus_textfile, daemon/host/prometheus.py) and the registry entry that `minilmd status --all` finds
(daemon/host/registry.py). `RunFiles` sets them up once the run directory is the supervisor's, and writes the
outcome at its end; what changes the phase stays in daemon/supervisor.py. Torch-free.
"""
from __future__ import annotations

from pathlib import Path

from minilmd import names, procs
from minilmd.config import RunConfig, recorded_copy
from minilmd.daemon.base.runstate import (
    EventLog,
    MetricsTail,
    RunState,
    load_state,
    new_state,
    now,
    read_heartbeat,
    reference_pass_words,
)
from minilmd.daemon.base.statesections import Outcome
from minilmd.daemon.host import registry
from minilmd.daemon.host.prometheus import Textfile
from minilmd.daemon.host.sdnotify import Notifier
from minilmd.daemon.slurm import requeue_bound
from minilmd.fsio import atomic_write_text
from minilmd.run_states import SyncState
from minilmd.untrusted import Unreadable


class RunFiles:
    """The run directory's files, set up (may raise OSError: a full or unwritable run.dir) for `cfg`'s run."""

    def __init__(self, cfg: RunConfig, run_dir: Path, config_path: Path, echo: bool, notifier: Notifier | None = None):
        self.run_dir = run_dir
        self.notifier = notifier or Notifier({})  # systemd's STATUS, told the step read here (none: no socket)
        (run_dir / names.ATTEMPT_LOGS).mkdir(exist_ok=True)
        copy = run_dir / names.RUN_CONFIG_COPY
        if config_path.resolve() != copy.resolve():
            atomic_write_text(copy, recorded_copy(config_path))  # its relative paths made absolute
        self.events = EventLog(run_dir, echo=echo)
        # a link the process checks meet on the run's path (minilmd/procs.py scope_or_none: the supervisor's loop) is
        # an event too, which status and logs show later
        procs.tell_links_to(run_dir, lambda said: self.events.emit("link", said))
        self.metrics = MetricsTail(run_dir / names.METRICS)
        self.state = RunState(run_dir / names.STATE, new_state(cfg.run.name, run_dir, str(config_path.resolve())))
        self.state.sync.state = SyncState.IDLE if cfg.run.remote else SyncState.OFF
        self.textfile: Textfile | None = None
        self._pass_seen: list[int] | None = None  # the reference pass as the heartbeat last gave it
        self._pass_quarter = 0  # the quarter of that attempt's pass last said (_say_reference_pass)

    def publish(self, cfg: RunConfig, config_path: Path) -> None:
        """The Prometheus textfile, and the registry entry (for `status --all`)."""
        self.textfile = Textfile(cfg.log.prometheus_textfile, self.state, self.events.emit)
        registry.register_quietly(cfg.run.name, self.run_dir, config_path, self.events.emit)

    def last_attempt(self) -> int:
        """The number of the newest attempt log already there (0: none): the next attempt numbers on from it."""
        logs = sorted(p for p in (self.run_dir / names.ATTEMPT_LOGS).iterdir() if names.is_attempt_log(p.name))
        return int(logs[-1].stem.split("-")[1]) if logs else 0

    def adopt_previous_state(self, remote: str | None) -> None:
        """What the previous supervisor's state.json holds that survives a restart (RunState.adopt), for a run whose
        remote is `remote` now; a remote checkpoint it recorded on another remote is said, and not adopted."""
        try:
            previous = load_state(self.run_dir)
            self.state.adopt(previous, remote)
            # in a Slurm job: its requeues after a last sync that gave up, counted across the run's starts
            requeue_bound.carry(self.state.slurm, previous.get("slurm") if isinstance(previous, dict) else None)
        except Unreadable as e:
            self.state.previous_unreadable = "" if e.missing else e.why
            if not e.missing:
                self.events.emit("adopt", f"the previous {names.STATE} cannot be read ({e.why}): nothing adopted",
                                 unreadable=e.why)  # for later starts: its remote step is unknown (remotewait)
        if (other := self.state.other_remote) is not None:
            old = other.path.rsplit("/", 1)[0] if other.path else "a remote it did not name"
            self.events.emit("adopt", f"run.remote is {remote or 'unset'} now: the previous {names.STATE} recorded "
                                      f"step {other.step} synced to {old}, another remote; nothing counts as synced "
                                      f"to {remote or 'a remote'} until a sync there (what {old} holds is left as it "
                                      f"is)", previous_remote=old, remote=remote)
        if self.state.overrides:
            self.events.emit("adopt", f"keeping overrides from the previous supervisor: {self.state.overrides}")

    def tick(self, phase: str) -> None:
        if self.textfile is not None:
            self.textfile.tick(phase)

    def read_progress(self) -> None:
        """The trainer's new metrics lines and its heartbeat into state.json's progress, and its step into systemd's
        STATUS (rate-limited there: daemon/host/sdnotify.py Notifier.progress)."""
        records = self.metrics.read_new()
        self.state.apply_progress(records, read_heartbeat(self.run_dir))
        progress = self.state.progress
        ref = progress.reference_pass
        self._say_reference_pass(ref, records)
        self.notifier.progress(progress.step, progress.total_steps, progress.loss,
                               reference_pass_words(ref) if ref else "")

    def _say_reference_pass(self, ref: list[int] | None, records: list[dict]) -> None:
        """A DPO run's reference pass (hours on a big corpus, before step 1) in supervisor.log and the journal: as
        each attempt's pass is first seen (a restarted trainer's starts again, or goes on from the pairs a stopped
        one kept), at each quarter of it, and its end as the trainer's metrics line records it (before: only the
        attempt log and `status` said how far it was)."""
        for rec in records:
            if rec.get("kind") == "dpo_reference" and isinstance(pairs := rec.get("pairs"), int):
                seconds = rec.get("seconds")
                how = f"computed in {seconds:.0f}s" if isinstance(seconds, (int, float)) else "read from the checkpoint"
                self.events.emit("reference", f"DPO reference pass done: {pairs:,} pairs {how}")
                self._pass_seen = None
        if not ref or ref[1] <= 0 or ref == self._pass_seen:
            return
        seen, self._pass_seen = self._pass_seen, ref
        quarter = min(4, 4 * ref[0] // ref[1])
        # another attempt's pass: its FROM, its count or its seconds (this attempt's, in the heartbeat) went back
        anew = seen is None or ref[0] < seen[0] or ref[2:3] != seen[2:3] or ref[3:] < seen[3:]
        if not anew and quarter <= self._pass_quarter:
            return
        self._pass_quarter = quarter
        kept = f"; going on from the {ref[2]:,} pairs a stopped pass kept" if len(ref) == 4 and ref[2] else ""
        self.events.emit("reference", f"DPO reference pass: {ref[0]:,}/{ref[1]:,} pairs ({100 * ref[0] // ref[1]}%), "
                                      f"before step 1{kept}")

    def record_outcome(self, exit_status: int, phase: str, ended: str) -> None:
        """The run's outcome in state.json now (`ended`: how the run ended, protocol.ENDED_*), saved: before a Slurm
        requeue, which ends this job at once (its supervisor may be killed before `close`)."""
        self.state.outcome = Outcome(exit=exit_status, phase=phase, time=now(), reason=self.state.reason, ended=ended)
        self.state.save()

    def close(self, exit_status: int, phase: str, ended: str) -> None:
        """The supervisor's last words: its outcome in state.json (`ended`: how the run ended, protocol.ENDED_*) and
        the textfile, the "exit" event."""
        self.state.outcome = Outcome(exit=exit_status, phase=phase, time=now(), reason=self.state.reason, ended=ended)
        if self.textfile is not None:
            self.textfile.close(phase)  # first: a textfile it cannot write is in the final state.json
        self.state.save()
        self.events.emit("exit", f"supervisor exits with status {exit_status} ({phase})", exit=exit_status)
        procs.tell_links_to(self.run_dir, None)
        self.events.close()
