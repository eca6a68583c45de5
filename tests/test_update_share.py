"""Guarding the base against a fine-tune: `run --check` prints the share of sample updates a run takes relative to
the run its init.from checkpoint comes from (a warning above eval.update_share_warn), and [eval] probe's loss is
evaluated with every validation."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.config import load_config
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.loop.train import Dist, Trainer
from trainer_corpus import read_metrics, write_config
from weights_helpers import tiny_model


def base_checkpoint(root, vocab: int, rows_seen: int):
    model = tiny_model(seed=1, vocab_size=vocab)
    state = {"step": 3, "rows_seen": rows_seen,
             "config": {"model": dataclasses.asdict(model.config), "data": {"prepared": ""}}}
    return ckpt_io.save(root, 3, model.state_dict(), torch.optim.AdamW(model.parameters()).state_dict(), state)


@pytest.mark.slow  # two config checks, each with its 5 s storage probe threads: ~3 s
def test_check_prints_the_update_share_and_warns_above_the_threshold(tmp_path, corpus):
    base = base_checkpoint(tmp_path / "base", corpus[1], rows_seen=1000)
    big = write_config(tmp_path, corpus, name="big", init={"from": str(base)}, train={"max_steps": 40})
    out = CliRunner().invoke(app, ["run", "--check", str(big)])
    assert out.exit_code == 0, out.output
    # 40 steps x 8 packed windows of 64 tokens = 320 rows: 320 / 621 windows an epoch x 380 documents = 196
    assert ("WARNING: update share: this run trains 196 sample updates (documents: 320 rows, each a window of 64 "
            "tokens across documents), 19.6 % of the 1,000 rows its base") in out.output
    assert "above eval.update_share_warn = 0.1" in out.output
    small = write_config(tmp_path, corpus, name="small", init={"from": str(base)}, train={"max_steps": 5})
    out = CliRunner().invoke(app, ["run", "--check", str(small)])
    assert "update share: this run trains 24 sample updates (documents: 40 rows" in out.output
    assert "2.4 % of the 1,000 rows" in out.output and "WARNING" not in out.output


@pytest.mark.slow
def test_the_probe_loss_is_evaluated_with_the_val_loss(tmp_path, corpus):
    prepared, _ = corpus
    cfg = load_config(write_config(tmp_path, corpus, name="probe", eval={"probe": str(prepared)}))
    t = Trainer(cfg, Dist(0, 1, 0, torch.device("cpu")))
    t.reports.log_eval(t.step)
    line = read_metrics(cfg.run_dir, "eval")[-1]
    # the probe is this run's own corpus in the same (packed) mode: the same rows, so exactly the val loss
    assert line["probe_loss"] == line["val_loss"] and 0 < line["val_loss"] < 20, line
