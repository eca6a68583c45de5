"""`minilmd bench step` on a tiny model: both modes are timed on the same steps and reported side by side, and
the compiled copy computes what the eager one does (same init, same rows, same losses)."""
from __future__ import annotations

import re

import pytest
import torch

from minilmd.cli import app
from minilmd.trainer.bench import step as bench_step

TINY = ["model.hidden_size=64", "model.num_hidden_layers=2", "model.vocab_size=512", "train.seq_len=32",
        "train.micro_batch_size=2", "train.device=\"cpu\""]


@pytest.mark.slow
def test_bench_step_prints_both_modes_and_their_ratios(capsys):
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["bench", "step", "--steps", "2", "--backend", "eager",
                                      *[a for s in TINY for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "model 64x2 (heads 4/2, vocab 512), seq_len 32, 2 rows x 1 micro-batches, cpu" in out
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(r"^(eager|compiled) +([\d,]+) +([\d.]+) +([\d.]+)$",
                                                             out, re.M)}
    assert set(rows) == {"eager", "compiled"} and all(float(v[0].replace(",", "")) > 0 for v in rows.values())
    assert re.search(r"compiled/eager tok/s: [\d.]+x; host time per step: [\d.]+x; the first compiled step "
                     r"\(compile\) took [\d.]+ s", out)

    cfg = bench_step.load(None, TINY)
    eager = bench_step.StepModel(cfg, torch.device("cpu"), compiled=False, backend="eager")
    compiled = bench_step.StepModel(cfg, torch.device("cpu"), compiled=True, backend="eager")
    for _ in range(2):
        eager.step(), compiled.step()
    for a, b in zip(eager.model.parameters(), compiled.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_bench_step_refuses_a_bad_config_and_no_steps(capsys):
    assert bench_step.main(None, 2, ["train.compile=\"maybe\""]) == 2
    assert "train.compile = 'maybe'" in capsys.readouterr().err
    assert bench_step.main(None, 0, TINY) == 2
