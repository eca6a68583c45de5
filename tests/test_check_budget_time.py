"""`minilmd run --check` of a run directory an earlier launch measured (state.json's tok/s) says when the budget's
steps left would take years at that rate, and when sync.every is longer than the whole run: notes, not refusals
(exit 0). A new user's walk found `--set train.max_steps=...` past int64 running with `step 660/99,999,...` and
sync.every = "99999999h" passing in silence. A fresh run has no rate, so no estimate and no such note."""
from __future__ import annotations

import json

import pytest

from minilmd.config import load_config
from minilmd.names import STATE
from supervisor_helpers import cli, run_supervisor, write_config


def measured(cfg, tok_s: float, step: int) -> None:
    """state.json as an earlier launch left it, its last measured rate in it."""
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / STATE).write_text(json.dumps({"phase": "stopped", "progress": {"step": step, "tok_s": tok_s}}))


def check(config, *sets: str) -> str:
    """The notes of `run --check` (exit 0), one a line."""
    args = [a for s in sets for a in ("--set", s)]
    out = cli("run", "--check", str(config), *args)
    assert out.returncode == 0, out.stdout + out.stderr
    return "\n".join(line for line in out.stdout.splitlines() if line.startswith("note: "))


@pytest.mark.slow
def test_a_budget_of_years_at_the_measured_rate_is_said_and_a_sync_that_never_comes_before_the_end(tmp_path, corpus):
    config = write_config(tmp_path, corpus, sync={"every": "7d"})  # 32 tokens x 4 rows a step
    cfg = load_config(config)
    fresh = check(config, "train.max_steps=9000000000000")
    assert "years" not in fresh and "sync.every" not in fresh, fresh  # no rate measured: no estimate
    measured(cfg, tok_s=128.0, step=10)  # a step a second
    said = check(config, "train.max_steps=9000000000000")  # no checkpoint anywhere: it starts from step 0, not 10
    assert ("note: the budget's 9,000,000,000,000 steps left take 285,388 years at the 128 tok/s this run last "
            "measured") in said, said
    assert "note: sync.every" not in said, said  # 7d is shorter than that
    short = check(config, "train.max_steps=70")  # 70 steps left, from step 0: a minute and ten seconds
    assert "years" not in short, short
    assert ("note: sync.every = '7d' is longer than the run takes (70s at the 128 tok/s this run last measured): "
            "no sync comes before the last one, at its end") in short, short
    assert "note: sync.every" not in check(config, "train.max_steps=70", 'sync.every="30s"')


@pytest.mark.slow
def test_a_run_that_trained_its_budget_has_no_time_left_to_say(tmp_path, corpus):
    """Its checkpoint is the step the launch resumes from (a run with none at all starts from step 0: above)."""
    config = write_config(tmp_path, corpus, sync={"every": "7d"}, train={"max_steps": 10})
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    state_file = load_config(config).run_dir / STATE
    recorded = json.loads(state_file.read_text())
    recorded["progress"]["tok_s"] = 128.0  # a step a second, as above
    state_file.write_text(json.dumps(recorded))
    for done in ("train.max_steps=10", "train.max_steps=5"):  # finished: no time left to say
        said = check(config, done)
        assert "years" not in said and "note: sync.every" not in said, said
    assert "note: sync.every" in check(config, "train.max_steps=70"), "the note this test looks for is said at all"


def test_check_says_when_checkpoint_every_leaves_the_run_no_checkpoint_before_its_end(tmp_path, corpus):
    """A new user set train.checkpoint_every = 10_000_000_000_000 (steps): --check said OK, and a kill -9 at step
    640 lost all 640 steps."""
    config = write_config(tmp_path, corpus, train={"max_steps": 30, "checkpoint_every": 10_000_000})
    check = cli("run", "--check", str(config))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "train.checkpoint_every = 10,000,000 steps, more than the run's 30: its only checkpoint is its last" \
        in check.stdout, check.stdout
    fine = write_config(tmp_path, corpus, name="fine", train={"max_steps": 30, "checkpoint_every": 10})
    assert "its only checkpoint is its last" not in cli("run", "--check", str(fine)).stdout
