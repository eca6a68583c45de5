"""`status` through a trainer's restart says the new trainer's step, total and pass, never the dead one's (found by a
new user, each twice):
- F7: a trainer that died at step 16 before its first checkpoint and logged no train line: the next one started
  again from step 0 and beat 5, 10, 12, while status said `step 16` under `since the first heartbeat from attempt 2
  (step 0)`, until the new trainer passed 16;
- F12a: `train.max_steps` raised from 300 to 400, the run started again: `step 78/300` until its first train line;
  a budget in tokens or epochs, which the trainer counts after what its checkpoint trained, likewise;
- F12b: a DPO trainer killed in its reference pass: through the backoff status said `DPO reference pass 112/1,211
  pairs, 56.0 pairs/s, ETA 20s`, a dead trainer's pass as if it ran.

The supervisor's own steps, on its files: the heartbeat and metrics.jsonl written as the trainer writes them, read
by its readers (read_heartbeat, MetricsTail), folded (RunState.apply_progress), the launch's heartbeat removal
(daemon/child/process.py) and its restart (await_new_rates), state.json read by `status`.
A heartbeat's mtime is set to the clock's, never before the restart's (a file's time may lag the clock by a tick)."""
from __future__ import annotations

import io
import json
import math
import os
import time
from pathlib import Path

from minilmd import names
from minilmd.daemon.base.runstate import MetricsTail, RunState, new_state, read_heartbeat
from minilmd.daemon.base.statesections import ChildInfo
from minilmd.daemon.views.status import status


class Supervisor:
    """The steps of a supervisor (this process: alive) that bear on progress, on the files of `run_dir`."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.state = RunState(run_dir / names.STATE, new_state("r", run_dir, str(run_dir) + ".toml"))
        self.tail = MetricsTail(run_dir / names.METRICS)
        self.attempt = 0

    def tick(self) -> None:
        self.state.apply_progress(self.tail.read_new(), read_heartbeat(self.run_dir))
        self.state.save()

    def restarted(self) -> None:
        """The earlier trainers' lines folded in, their rate set aside (supervisor.py `_restarted`)."""
        self.tick()
        self.state.await_new_rates()
        self.state.save()

    def launch(self) -> None:
        self.attempt += 1
        (self.run_dir / names.HEARTBEAT).unlink(missing_ok=True)  # every heartbeat from here on is this attempt's
        self.restarted()
        self.state.child = ChildInfo(pid=os.getpid(), attempt=self.attempt, started=1.0)
        self.state.phase = "training"
        self.tick()

    def died(self) -> None:
        self.tick()
        self.state.child = None
        self.state.phase = "backoff"
        self.tick()

    def beat(self, body: str) -> None:
        """The trainer's heartbeat, after the last restart."""
        beat = self.run_dir / names.HEARTBEAT
        beat.write_text(body + "\n")
        since = self.state.progress.rates_awaited_since
        at = max(time.time_ns(), math.ceil(since * 1e9) + 1000 if since is not None else 0)  # never before it
        os.utime(beat, ns=(at, at))
        self.tick()

    def status(self) -> str:
        out = io.StringIO()
        assert status(self.run_dir, out=out) == 0
        return out.getvalue()


def run_dir_in(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return run_dir


def step_line(said: str) -> str:
    return next(line for line in said.splitlines() if line.startswith(("  step ", "  last known step ")))


def test_a_trainer_restarted_below_the_step_of_one_that_died_before_logging_shows_its_own_step(tmp_path):
    sup = Supervisor(run_dir_in(tmp_path))
    sup.launch()
    for step in (0, 8, 16):  # log_every 50: no train line before it died
        sup.beat(f"{step}/300")
    assert step_line(sup.status()).startswith("  step 16"), sup.status()
    sup.died()
    sup.launch()  # no checkpoint: from step 0
    said = sup.status()
    assert step_line(said).startswith("  last known step 16"), said  # nothing of the new trainer yet
    for step in (0, 5, 10, 12):
        sup.beat(f"{step}/300")
        said = sup.status()
        assert step_line(said).startswith(f"  step {step}/300 "), said  # main: "step 16" all along
        assert "no ETA until the new trainer logs a step" in said, said


def earlier_trainer_at_78_of(run_dir: Path, total: int) -> None:
    """metrics.jsonl of the earlier supervisor's trainer: at step 78 of `total`."""
    with open(run_dir / names.METRICS, "w") as f:
        f.write(json.dumps({"kind": "train", "step": 78, "tokens_seen": 7_800, "loss": 3.0, "lr": 1e-3,
                            "tok_s": 500.0, "step_time": 0.2, "total_steps": total, "time": 1000.0}) + "\n")


def test_a_restart_with_a_raised_budget_shows_the_new_total_from_the_first_heartbeat(tmp_path):
    run_dir = run_dir_in(tmp_path)
    earlier_trainer_at_78_of(run_dir, 300)
    sup = Supervisor(run_dir)  # started again with train.max_steps = 400
    sup.restarted()  # at its start
    assert step_line(sup.status()).startswith("  last known step 78 (of 300 then)"), sup.status()
    sup.launch()
    sup.beat("78/400 compiling")  # the trainer's heartbeat: its step and the total it counts (minilmd/metrics.py)
    assert step_line(sup.status()).startswith("  step 78/400 (19.5%)"), sup.status()  # main: 78/300
    sup.beat("79/400")
    assert step_line(sup.status()).startswith("  step 79/400 "), sup.status()


def test_a_budget_in_tokens_shows_the_total_the_restarted_trainer_counts_from_its_first_heartbeat(tmp_path):
    """A budget in tokens (or epochs) is the trainer's to count, after what its checkpoint trained at its batch: the
    restarted trainer's heartbeat says it, shown at once. On main the earlier trainer's total stayed until the new
    trainer's first train line (`step 78/300` of a budget now 950 steps), the config alone not saying it. A
    heartbeat that says no total (a trainer that does not know it yet) shows the step alone, never the old total."""
    run_dir = run_dir_in(tmp_path)
    earlier_trainer_at_78_of(run_dir, 300)
    sup = Supervisor(run_dir)  # its config: train.max_tokens, which only the trainer turns into steps
    sup.restarted()
    sup.launch()
    sup.beat("78")
    assert step_line(sup.status()).startswith("  step 78  "), sup.status()
    sup.beat("78/950 compiling")
    assert step_line(sup.status()).startswith("  step 78/950 (8.2%)"), sup.status()
    sup.beat("80/950")
    assert step_line(sup.status()).startswith("  step 80/950 "), sup.status()


def test_the_trainers_heartbeat_says_its_total_once_it_knows_it(tmp_path):
    """The heartbeat the trainer writes (MetricsLog) and the one the supervisor reads (read_heartbeat) agree: "STEP"
    before the total is known, "STEP/TOTAL" after, a phase and its note behind it."""
    from minilmd.metrics import MetricsLog

    log = MetricsLog(tmp_path)
    log.heartbeat(3, force=True)
    assert (read_heartbeat(tmp_path).step, read_heartbeat(tmp_path).total) == (3, None)
    log.total_steps = 950
    log.heartbeat(78, phase=names.HEARTBEAT_REFERENCE, force=True, note="5/10/0/1")
    beat = read_heartbeat(tmp_path)
    assert (beat.step, beat.total, beat.phase, beat.reference_pass()) == (78, 950, "reference", [5, 10, 0, 1])


def test_a_dead_trainers_reference_pass_is_not_shown_as_going_on(tmp_path):
    sup = Supervisor(run_dir_in(tmp_path))
    sup.launch()
    sup.beat(f"0 {names.HEARTBEAT_REFERENCE} 112/1211/0/2")
    assert "  step 0  DPO reference pass 112/1,211 pairs, 56.0 pairs/s, ETA 20s" in sup.status(), sup.status()
    sup.died()  # killed: its heartbeat file stays until the next launch
    said = sup.status()
    assert "DPO reference pass" not in said and "pairs/s" not in said, said  # main: the pass, its rate, its ETA
    assert json.loads((sup.run_dir / names.STATE).read_text())["progress"].get("reference_pass") is None
    sup.launch()  # before its first heartbeat: nothing of a pass either
    assert "DPO reference pass" not in sup.status(), sup.status()
    sup.beat(f"0 {names.HEARTBEAT_REFERENCE} 40/1211/0/1")  # the new trainer's pass
    assert "  DPO reference pass 40/1,211 pairs, 40.0 pairs/s" in sup.status(), sup.status()


def test_a_trainer_resumed_below_the_dead_ones_step_is_not_shown_with_the_dead_ones_loss_and_rate(tmp_path):
    """Found by a new user: SFT trainer SIGKILLed at step 168 (last train line at 160, loss 2.1110), resumed from the
    checkpoint of step 142: status said `step 144/576 (25.0%)  loss 2.1110 ... lr 0.000421`, step 160's loss and
    rate beside step 144, under a sparkline ending at step 140's 2.4372. Until the new trainer logs a step, the
    step line has neither; its first train line brings both back."""
    run_dir = run_dir_in(tmp_path)
    sup = Supervisor(run_dir)
    sup.launch()
    with open(run_dir / names.METRICS, "a") as f:
        for step, loss, lr in ((140, 2.4372, 4.3e-4), (150, 2.3, 4.25e-4), (160, 2.1110, 4.21e-4)):
            f.write(json.dumps({"kind": "train", "step": step, "loss": loss, "lr": lr, "tok_s": 500.0,
                                "step_time": 0.1, "total_steps": 576, "time": 1000.0 + step}) + "\n")
    sup.beat("168/576")
    assert "loss 2.1110" in step_line(sup.status()), sup.status()
    sup.died()
    sup.launch()  # from the checkpoint of step 142
    for step in ("142", "144"):
        sup.beat(f"{step}/576")  # the new trainer says its total in its beats
        line = step_line(sup.status())
        assert line.startswith(f"  step {step}/576 ") and "loss" not in line and "lr " not in line, line
    with open(run_dir / names.METRICS, "a") as f:
        f.write(json.dumps({"kind": "train", "step": 150, "loss": 2.25, "lr": 4.25e-4, "tok_s": 500.0,
                            "step_time": 0.1, "total_steps": 576, "time": 2000.0}) + "\n")
    sup.tick()
    line = step_line(sup.status())
    assert line.startswith("  step 150/576 ") and "loss 2.2500" in line and "lr 0.000425" in line, line


def test_a_restarted_trainer_at_the_final_step_keeps_its_total_through_its_exiting_beat(tmp_path):
    """A trainer started again at the final step (its predecessor killed in a slow teardown) logs no train line: its
    beats say its total, then its exiting beat, which says none (minilmd/metrics.py: readable by a supervisor from
    before the total). The total it said stays: `step 20/20 (100.0%)`, not `step 20` alone."""
    run_dir = run_dir_in(tmp_path)
    earlier_trainer_at_78_of(run_dir, 300)
    sup = Supervisor(run_dir)
    sup.restarted()
    sup.launch()
    sup.beat("300/300")
    sup.beat(f"300 {names.HEARTBEAT_EXITING}")
    assert step_line(sup.status()).startswith("  step 300/300 (100.0%)"), sup.status()
