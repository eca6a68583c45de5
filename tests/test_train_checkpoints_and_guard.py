"""The trainer in this process, on a tiny model: under a supervisor it neither prunes nor reads back its
checkpoints after a save; on its own it prunes to keep_local; a non-finite loss stops it at the step it
appears, logged or not, before anything of that step is saved."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from minilmd import checkpoint, checkpoint_dirs, checkpoint_select
from minilmd.config import load_config
from minilmd.names import METRICS, RUN_DIR_ENV, SUPERVISOR_PROCESS_ENV
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.loop.distributed import init_distributed
from minilmd.trainer.loop.train import Trainer
from trainer_corpus import write_config


class Spy:
    """Counts the calls of a function it stands in for, and calls it. With `under`, only the calls whose first
    argument is a path below it: a thread another test of this pytest worker left running may call the same
    function on its own files meanwhile (a remote watcher validating its checkpoints did)."""

    def __init__(self, fn, under: Path | None = None):
        self.fn, self.under, self.calls = fn, under, []

    def __call__(self, *args, **kwargs):
        if self.under is None or (args and Path(args[0]).is_relative_to(self.under)):
            self.calls.append(args)
        return self.fn(*args, **kwargs)


def make_trainer(tmp_path: Path, corpus, **train) -> Trainer:
    config = write_config(tmp_path, corpus, train={"max_steps": 8, "checkpoint_every": 2, "keep_local": 1,
                                                   "grad_accum": 1, **train})
    cfg = load_config(config)
    return Trainer(cfg, init_distributed(cfg))


def saved_steps(trainer: Trainer) -> list[int]:
    return [checkpoint.step_of(p) for p in checkpoint_dirs.list_checkpoints(trainer.cfg.checkpoint_dir)]


@pytest.fixture
def spies(monkeypatch, tmp_path):
    """Spies on the pruning the checkpointer calls and on every validation of a checkpoint of this test's (prune
    validates, through checkpoint_select's name for it)."""
    prune, validate = Spy(ckpt_io.prune), Spy(checkpoint.validate, under=tmp_path)
    monkeypatch.setattr(ckpt_io, "prune", prune)
    monkeypatch.setattr(checkpoint, "validate", validate)
    monkeypatch.setattr(checkpoint_select, "validate", validate)
    return prune, validate


def under_a_supervisor(tmp_path, monkeypatch) -> None:
    """As a supervisor's trainer: MINILMD_RUN_DIR and MINILMD_SUPERVISOR_PROCESS set (a supervisor on another host:
    supervised, not watched), run.dir and scratch made before the launch (the trainer never makes them under a
    supervisor: minilmd/metrics.py RunDirGone, minilmd/checkpoint_pin.py ScratchGone)."""
    (tmp_path / "t" / "run").mkdir(parents=True, exist_ok=True)
    (tmp_path / "t" / "scratch").mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path / "t" / "run"))
    monkeypatch.setenv(SUPERVISOR_PROCESS_ENV, "1 1 not-this-host")


def test_under_a_supervisor_no_checkpoint_is_pruned_or_read_back(tmp_path, corpus, monkeypatch, spies):
    prune, validate = spies
    under_a_supervisor(tmp_path, monkeypatch)
    trainer = make_trainer(tmp_path, corpus)
    assert trainer.train() == 0
    assert saved_steps(trainer) == [2, 4, 6, 8]  # keep_local is 1: only the supervisor may prune scratch
    assert prune.calls == [] and validate.calls == []


def test_on_its_own_the_trainer_prunes_to_keep_local(tmp_path, corpus, monkeypatch, spies):
    prune, validate = spies
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    trainer = make_trainer(tmp_path, corpus)
    assert trainer.train() == 0
    assert saved_steps(trainer) == [8]
    assert len(prune.calls) == 4 and validate.calls  # the spies see what the other test says did not happen


def test_a_nan_loss_on_a_step_that_is_not_logged_stops_the_run_at_that_step(tmp_path, corpus, monkeypatch):
    under_a_supervisor(tmp_path, monkeypatch)  # no pruning: every checkpoint stays visible
    trainer = make_trainer(tmp_path, corpus, log_every=100, checkpoint_every=1)
    real_step = trainer.train_step

    def nan_from_step_5():  # the update that makes step 5 out of step 4 has a NaN loss
        loss, grad_norm, n_real = real_step()
        return (loss * float("nan") if trainer.step == 4 else loss), grad_norm, n_real

    monkeypatch.setattr(trainer, "train_step", nan_from_step_5)
    with pytest.raises(RuntimeError, match="the training loss is nan at step 5: refusing to continue"):
        trainer.train()
    trainer.checkpointer.wait()
    assert trainer.step == 5 and saved_steps(trainer) == [1, 2, 3, 4]
    lines = (trainer.cfg.run_dir / METRICS).read_text().splitlines()
    assert lines and all('"kind": "checkpoint"' in line for line in lines)  # step 5 was not a log step


@pytest.mark.slow  # a DPO trainer, its reference computed over the corpus first
def test_a_nan_in_a_dpo_step_stops_the_run_at_that_step(tmp_path, small_dpo_corpus, monkeypatch):
    """The guard is the objective's too: a NaN in one DPO micro-batch's reference log-probabilities (what a
    damaged reference or a diverging policy gives) makes the step's loss NaN, though its reward accuracy stays a
    number (a NaN margin is simply not above 0), and the run stops at that step, nothing of it saved."""
    under_a_supervisor(tmp_path, monkeypatch)
    trainer = make_trainer(tmp_path, small_dpo_corpus, seq_len=128, micro_batch_size=4, log_every=1, checkpoint_every=1)
    real_loss = trainer.objective.loss

    def nan_reference_at_step_5(model, batch):
        if trainer.step == 4:  # the update that makes step 5 out of step 4
            batch = batch._replace(reference=batch.reference * float("nan"))
        return real_loss(model, batch)

    monkeypatch.setattr(trainer.objective, "loss", nan_reference_at_step_5)
    with pytest.raises(RuntimeError, match="the training loss is nan at step 5: refusing to continue"):
        trainer.train()
    trainer.checkpointer.wait()
    assert trainer.step == 5 and saved_steps(trainer) == [0, 1, 2, 3, 4]  # 0: the reference, kept at once
    assert float(trainer.step_metrics["reward_accuracy"]) == 0.0
    logged = [json.loads(line) for line in (trainer.cfg.run_dir / METRICS).read_text().splitlines()]
    assert [r["step"] for r in logged if r["kind"] == "train"] == [1, 2, 3, 4]  # no line of step 5's NaN
