"""A run already done (its newest checkpoint at its budget's last step: daemon/jobs/rundone.py): `run --check` says
so instead of "resumes from step N", and `minilmd run` starts nothing (no staging, no trainer, no sync) and exits 0;
the budget raised in the config trains on. Before, the launch staged, fetched, started a trainer, synced and exited
0, and a tmux launcher or a systemd restart did it all again."""
from __future__ import annotations

import json

import pytest

from minilmd.config import load_config
from supervisor_helpers import cli, events, run_supervisor, write_config

pytestmark = pytest.mark.slow  # a fake run to its end, then two launches of it


def test_a_finished_run_is_done_at_check_and_at_launch_until_its_budget_is_raised(tmp_path, corpus):
    config = write_config(tmp_path, corpus, name="done", train={"max_steps": 8, "checkpoint_every": 4})
    run_dir = load_config(config).run_dir
    assert run_supervisor(config, tmp_path) == 0
    said_then = events(run_dir)

    checked = cli("run", "--check", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "): nothing to do; to train on, raise the budget (train.max_steps = 8)" \
        in checked.stdout and "run is done (step 8/8; " in checked.stdout, checked.stdout
    assert "resumes from" not in checked.stdout and "update share" not in checked.stdout, checked.stdout

    launched = cli("run", str(config), timeout=120)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "minilmd run: run is done (step 8/8; " in launched.stdout, launched.stdout
    assert events(run_dir) == said_then  # no supervisor started: nothing staged, fetched, trained or synced

    recorded = json.loads((run_dir / "state.json").read_text())  # as if its supervisor died before the last sync
    (run_dir / "state.json").write_text(json.dumps({**recorded, "remote_checkpoint": None}))
    unsynced = cli("run", "--check", str(config))
    assert "resumes from step 8 (scratch: " in unsynced.stdout and "run is done" not in unsynced.stdout, \
        unsynced.stdout  # the launch's trainer ends at once and the last sync copies it
    (run_dir / "state.json").write_text(json.dumps(recorded))

    raised = cli("run", "--check", "--set", "train.max_steps=12", str(config))
    assert raised.returncode == 0 and "resumes from step 8 (" in raised.stdout, raised.stdout
    assert "run is done" not in raised.stdout, raised.stdout
