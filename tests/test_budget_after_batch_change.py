"""A budget in tokens or epochs is counted in what the run has trained (its checkpoint's rows and token positions,
plan/trainer_state.py Trained), the rest at today's batch (plan/budget.py budget_steps): `run --check`, the trainer
and `status` (the trainer's total_steps in metrics.jsonl) agree. Before (user report 9, finding 1), the budget was
turned into steps at today's batch and compared with the global step: 532 steps at micro-batch 8 and 468 at 16 (1.5
M tokens) were "done" under max_tokens = 3 M at micro-batch 32 (733 steps), and an SFT run of max_epochs = 6
stopped at micro-batch 16 after 100 steps at 8 trained 4 epochs and said done."""
from __future__ import annotations

import json

import pytest

from minilmd.config import config_from_dict, load_config
from minilmd.daemon.base.runstate import read_heartbeat
from minilmd.daemon.jobs.rundone import done_line
from minilmd.plan.budget import budget_line, planned, total_steps_for_budget
from minilmd.plan.trainer_state import Trained, trained
from supervisor_helpers import cli
from trainer_corpus import read_metrics, write_config

TEXT = {"data_format": "text", "splits": {"train": {"documents": 3_000, "tokens": 400_000}}}
CHAT = {"data_format": "chat", "splits": {"train": {"documents": 425, "tokens": 100_000}}}
"""Bucketed at micro-batch 8 or 16: 424 or 416 conversations an epoch (full buckets)."""


def config(tmp_path, **train):
    return config_from_dict({"run": {"name": "b", "dir": str(tmp_path / "run")},
                             "data": {"prepared": str(tmp_path / "corpus")},
                             "train": {"device": "cpu", "seq_len": 128, "grad_accum": 1, **train}})


def test_a_token_budget_counts_the_tokens_trained_at_the_old_batch(tmp_path):
    # 532 steps of 8 rows, then 468 of 16: 11,744 rows x 128 = 1,503,232 token positions trained
    done = Trained(step=1_000, rows=532 * 8 + 468 * 16, positions=(532 * 8 + 468 * 16) * 128)
    cfg = config(tmp_path, max_tokens=3_000_000, micro_batch_size=32)
    plan = planned(cfg, TEXT, done=done)
    # the 1,496,768 left at 32 x 128 = 4,096 a step: 366 steps more (before: 733 steps in all, "none of it is left")
    assert plan is not None and plan.steps == 1_366 and plan.positions >= 3_000_000
    assert done_line(cfg, 1_000, "scratch: x", done) is None  # not done
    line = budget_line(cfg, plan)
    assert line.startswith("budget: 1,366 steps: the 1,000 trained (11,744 rows, 1.5 M tokens), then 366 x 32 rows x "
                           "128 tokens = 3.0 M tokens"), line
    assert total_steps_for_budget(cfg, 32, None, done) == 1_366  # the trainer's count, the same rule


def test_an_epoch_budget_counts_the_rows_trained_at_the_old_batch(tmp_path):
    cfg = config(tmp_path, max_epochs=6.0, micro_batch_size=16)
    done = Trained(step=100, rows=800, positions=800 * 128)  # 100 steps of 8 conversations
    plan = planned(cfg, CHAT, done=done)
    # 6 x 416 = 2,496 rows, 1,696 left at 16 a step: 106 more (before: 156 in all, 100 x 8 + 56 x 16 = 4 epochs)
    assert plan is not None and plan.steps == 206 and plan.epochs is not None and plan.epochs >= 6.0


def test_an_unchanged_batch_counts_as_a_fresh_start_does(tmp_path):
    cfg = config(tmp_path, max_tokens=1_000_000, max_epochs=3.0, micro_batch_size=8)
    fresh = planned(cfg, TEXT)
    assert fresh is not None
    for step in (0, 1, 97, fresh.steps):
        again = planned(cfg, TEXT, done=Trained(step, step * 8, step * 8 * 128))
        assert again is not None and (again.steps, again.limits, again.done) == (fresh.steps, fresh.limits, None)


def test_what_an_older_checkpoint_trained_is_read_from_its_rows_and_seq_len():
    old = {"step": 10, "global_batch": 4, "config": {"train": {"seq_len": 32}}}  # before rows_seen, positions_seen
    assert trained(old) == Trained(10, 40, 1_280)
    assert trained({**old, "rows_seen": 36, "positions_seen": 999}) == Trained(10, 36, 999)
    assert trained({"step": 3}, 8, 64) == Trained(3, 24, 1_536) and trained({"step": 3}) is None


@pytest.mark.slow  # two tiny real trainer runs
def test_a_resume_with_a_doubled_micro_batch_trains_the_token_budget(tmp_path, corpus):
    # 4 steps of 2 rows x 64 tokens = 512 positions; then max_tokens = 1,536 at 4 rows: 1,024 left, 4 steps more
    path = write_config(tmp_path, corpus, name="tok", train={"micro_batch_size": 2, "grad_accum": 1, "max_steps": 4,
                                                             "checkpoint_every": 2, "warmup_steps": 0})
    first = cli("train", str(path), timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    sets = ("--set", "train.max_steps=0", "--set", "train.max_tokens=1536", "--set", "train.micro_batch_size=4")
    check = cli("run", "--check", str(path), *sets)
    # before: ceil(1,536 / 256) = 6 steps, 2 of them left: 1,024 positions in all
    assert check.returncode == 0 and "budget: 8 steps: the 4 trained (8 rows, 512 tokens), then 4 x 4 rows x 64 " \
        "tokens = 1,536 tokens" in check.stdout, check.stdout + check.stderr
    cfg = load_config(path)
    crashed = cli("train", str(path), *sets, timeout=600, MINILMD_FAULT="exception@7")  # its beats are left to read
    assert crashed.returncode != 0 and "injected exception" in crashed.stdout + crashed.stderr, crashed.stderr
    beat = read_heartbeat(cfg.run_dir)  # the resumed trainer's every heartbeat says that total: a restart's too
    assert beat is not None and beat.step is not None and 4 <= beat.step <= 7 and beat.total == 8, beat
    second = cli("train", str(path), *sets, timeout=600)  # the fault fired once: this one trains to the end
    assert second.returncode == 0, second.stdout + second.stderr
    last = [m for m in read_metrics(cfg.run_dir, "train")][-1]
    assert (last["step"], last["total_steps"]) == (8, 8), last  # status shows the trainer's step/total_steps
    beat = read_heartbeat(cfg.run_dir)  # but its exiting beat the step alone (tests/test_heartbeat_upgrade.py)
    assert beat is not None and (beat.step, beat.phase, beat.total) == (8, "exiting", None), beat
    state = json.loads((cfg.checkpoint_dir / "step-00000008" / "trainer_state.json").read_text())
    assert (state["rows_seen"], state["positions_seen"]) == (24, 1_536)
    again = cli("run", "--check", str(path), *sets)
    assert "run is done (step 8/8" in again.stdout, again.stdout + again.stderr
