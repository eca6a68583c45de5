"""A run trained by hand (`minilmd train`, no supervisor) is said as such by the views given its config or run.dir,
with where its metrics and checkpoints are, and `minilmd sample` takes its config (user8 #5: the views said "give
... the config itself", which was what the user gave, and sample could not find the checkpoints)."""
from __future__ import annotations

import pytest

from in_process import train_in_process
from minilmd import names
from minilmd.config import load_config
from supervisor_helpers import cli, write_config

pytestmark = pytest.mark.slow  # a real training run, then the CLI in processes of their own


def test_a_hand_run_is_said_as_one_and_sample_takes_its_config(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False, train={"max_steps": 4, "checkpoint_every": 2})
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    trained = train_in_process(config)
    assert trained.returncode == 0, trained.stderr[-2000:]
    for command in (["status"], ["logs"], ["plot", "--out", str(tmp_path / "loss.png")]):
        for given in (config, cfg.run_dir):
            said = cli(command[0], str(given), *command[1:], timeout=120)
            assert said.returncode != 0
            assert "trained by hand (`minilmd train`, no supervisor ran it" in said.stderr + said.stdout
            assert str(cfg.run_dir / names.METRICS) in said.stderr + said.stdout
            assert "the config itself`" not in said.stderr + said.stdout
    sampled = cli("sample", str(config), "--prompt", "x", "--max-new-tokens", "2", "--temperature", "0",
                  "--device", "cpu", timeout=180)
    assert sampled.returncode == 0, sampled.stderr[-2000:]
