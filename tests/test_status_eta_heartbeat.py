"""The time left, in `status` and `run --check`, counted from the step shown (the heartbeat's when newer than the
last train line) at a rate whose parts are one train line's (found by a new user, twice: `run --check` took the
heartbeat's step 85 with the tokens of the line of step 50 and said `the 215 steps left take about 2m` of 165 s,
while status said `ETA 3m`; status's ETA moved only at the train lines: `step 117/120 ... ETA 9s` at 2 steps a
second, `ETA 84s` from step 26 to step 35).

The supervisor's fold (RunState.apply_progress) of a metrics.jsonl and a heartbeat written as the trainer writes
them, read by the supervisor's own readers, its state.json then read by `status` and `run --check`'s rate."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

from minilmd import names
from minilmd.cli.run import measured_rate
from minilmd.config import config_from_dict
from minilmd.daemon.base.runstate import MetricsTail, RunState, new_state, read_heartbeat
from minilmd.daemon.base.statesections import ChildInfo
from minilmd.daemon.views.status import status
from minilmd.plan.budget import budget_line, planned, time_left

TEXT = {"data_format": "text", "splits": {"train": {"documents": 1_000, "tokens": 1_000_000}}}
"""A packed text corpus: every position a real token (tests/test_check_budget_line.py's)."""

TOKENS_A_STEP = 1_000
STEP_TIME = 0.2
TOK_S = TOKENS_A_STEP / STEP_TIME  # 5,000 tok/s: the line's rate and its step time agree


def running(run_dir: Path) -> RunState:
    """The state of a supervisor (this process: alive) whose trainer runs."""
    state = RunState(run_dir / names.STATE, new_state("eta", run_dir, str(run_dir) + ".toml"))
    state.phase = "training"
    state.child = ChildInfo(pid=os.getpid(), attempt=1, started=1.0, log="logs/attempt-0001.log")
    return state


def log_train(run_dir: Path, step: int, total: int) -> None:
    with open(run_dir / names.METRICS, "a") as f:
        f.write(json.dumps({"kind": "train", "step": step, "tokens_seen": step * TOKENS_A_STEP, "loss": 3.0,
                            "lr": 1e-3, "tok_s": TOK_S, "step_time": STEP_TIME, "total_steps": total,
                            "time": 1000.0 + step}) + "\n")


def beat(run_dir: Path, step: int, at: float) -> None:
    (run_dir / names.HEARTBEAT).write_text(f"{step}\n")
    os.utime(run_dir / names.HEARTBEAT, (at, at))


def fold(state: RunState, tail: MetricsTail) -> None:
    """One tick of the supervisor: the new lines and the heartbeat folded in, state.json saved."""
    state.apply_progress(tail.read_new(), read_heartbeat(state.path.parent))
    state.save()


def step_line(run_dir: Path) -> str:
    out = io.StringIO()
    assert status(run_dir, out=out) == 0
    return next(line for line in out.getvalue().splitlines() if line.startswith("  step "))


def test_the_eta_counts_the_steps_left_from_the_heartbeats_step_and_moves_with_it(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state, tail = running(run_dir), MetricsTail(run_dir / names.METRICS)
    log_train(run_dir, 50, 300)
    beat(run_dir, 85, 2000.0)  # 35 steps since the line: the heartbeat's step is the one shown
    fold(state, tail)
    line = step_line(run_dir)
    # 215 steps left x 0.2 s = 43 s (main: the line's 250 steps left, 50 s, until the next line)
    assert line.startswith("  step 85/300 (28.3%)") and line.endswith("ETA 43s"), line
    beat(run_dir, 95, 2002.0)  # no train line since: the ETA moves with the heartbeat all the same
    fold(state, tail)
    assert step_line(run_dir).endswith("ETA 41s"), step_line(run_dir)
    saved = json.loads((run_dir / names.STATE).read_text())["progress"]
    assert saved["step"] == 95 and saved["eta_s"] == (300 - 95) * STEP_TIME, saved
    assert saved["tokens_seen"] == 50 * TOKENS_A_STEP and saved["tokens_seen_step"] == 50, saved


def test_run_check_times_the_steps_left_at_one_lines_tokens_a_step_and_agrees_with_the_eta(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state = running(run_dir)
    log_train(run_dir, 50, 300)
    beat(run_dir, 85, 2000.0)
    fold(state, MetricsTail(run_dir / names.METRICS))
    cfg = config_from_dict({"run": {"name": "eta", "dir": str(run_dir)}, "data": {"prepared": str(tmp_path / "c")},
                            "train": {"device": "cpu", "seq_len": 100, "micro_batch_size": 10, "grad_accum": 1,
                                      "max_steps": 300}})
    rate = measured_rate(cfg)  # where the launch resumes not known: from the step shown
    assert rate is not None and rate.step == 85, rate
    plan = planned(cfg, TEXT)
    # 215 x 1,000 tokens / 5,000 tok/s = 43 s, status's ETA (main: 50,000 tokens / 85 steps a step, 25 s)
    assert time_left(plan, rate) == (215, 43.0)
    assert rate.tokens_a_step == TOKENS_A_STEP
    assert budget_line(cfg, plan, rate).endswith(
        "; the 215 steps left after step 85 (the last known: where the launch resumes is not known) take about "
        "43s at the 5,000 tok/s this run last measured"), budget_line(cfg, plan, rate)
    assert state.progress.eta_s == 43.0


def test_run_check_times_the_whole_budget_when_its_remote_line_says_the_launch_starts_from_step_0(tmp_path, corpus):
    """A reboot emptied scratch of a run that never synced (its remote not made yet): the launch starts from step 0,
    as `run --check`'s own line says. Before, its budget line counted from the step state.json last recorded: "the
    225 steps left after step 175 (the last known: where the launch resumes is not known)" (a new user's run)."""
    from supervisor_helpers import cli, write_config

    config = write_config(tmp_path, corpus, train={"max_steps": 300})
    run_dir = tmp_path / "s" / "run"  # trainer_corpus.write_config's
    run_dir.mkdir(parents=True)
    state = running(run_dir)
    log_train(run_dir, 50, 300)
    beat(run_dir, 85, 2000.0)
    fold(state, MetricsTail(run_dir / names.METRICS))
    said = cli("run", "--check", str(config))
    assert said.returncode == 0, said.stdout + said.stderr
    assert "starts from step 0: run.remote: " in said.stdout, said.stdout
    assert "the last known" not in said.stdout and "; all of it take about " in said.stdout, said.stdout
