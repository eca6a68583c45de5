"""init.from naming a LoRA run (its config, its run directory's checkpoints, a checkpoint of it): its checkpoints
hold adapters on its base, not a model, so no stage starts from one. `run --check` and the launch refuse it at once
(before staging, before waiting hours for it to finish), by the rule the trainer refuses it with
(init_source.adapter_source), in words that say what to do."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from minilmd.config import ConfigError, load_config
from minilmd.trainer.loop.train import Dist, Trainer
from trainer_corpus import child_env, write_config
from weights_helpers import save_checkpoint, tiny_model

pytestmark = pytest.mark.slow  # a LoRA run trained, a Trainer and two CLI checks

LORA = {"rank": 4, "alpha": 16.0, "targets": ["q_proj", "v_proj"]}
SAID = "a LoRA run ([lora] alpha = 16.0, dropout = 0.0, rank = 4, targets = ['q_proj', 'v_proj']): its checkpoints"


def _check(config) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", "run", "--check", str(config)], capture_output=True,
                          text=True, timeout=300, env=child_env())


def test_a_full_weight_stage_from_a_lora_run_is_refused_by_the_check_and_the_trainer_alike(tmp_path, corpus):
    _, vocab = corpus
    base = save_checkpoint(tmp_path / "base" / "checkpoints", tiny_model(seed=5, vocab_size=vocab), step=2)
    lora_cfg = write_config(tmp_path, corpus, name="lora", init={"from": str(base.parent)}, lora=LORA,
                            train={"max_steps": 2, "checkpoint_every": 2})

    # Not started yet (the launch would wait in waiting_init for it): refused from its config.
    waiting = write_config(tmp_path, corpus, name="full-waiting", init={"from": str(lora_cfg)})
    out = _check(waiting)
    assert out.returncode == 2 and f"run lora is {SAID}" in out.stderr, out.stdout + out.stderr
    assert "merge" in out.stderr and "update share" not in out.stdout

    # Finished: its checkpoints, named by their root, are refused by --check, by the same words the trainer uses.
    lora_run = load_config(lora_cfg)
    assert Trainer(lora_run, Dist(0, 1, 0, torch.device("cpu"))).train() == 0
    full = write_config(tmp_path, corpus, name="full", init={"from": str(lora_run.checkpoint_dir)})
    out = _check(full)
    assert out.returncode == 2 and SAID in out.stderr, out.stdout + out.stderr
    assert "OK" not in out.stdout and "WARNING" not in out.stdout

    with pytest.raises(ConfigError) as e:  # the trainer run on its own (no check before it)
        Trainer(load_config(full), Dist(0, 1, 0, torch.device("cpu")))
    assert SAID in str(e.value) and "the run has off" not in str(e.value)
