"""`minilmd bench step` on a tiny model: the four modes (eager and compiled, the loss in the model or outside) are
timed on the same steps and reported side by side; the compiled copy computes what the eager one does (same init,
same rows, same losses), and the step is the trainer's own (trainer/loop/step.py)."""
from __future__ import annotations

import re

import pytest
import torch

from minilmd.cli import app
from minilmd.trainer.bench import step as bench_step

TINY = ["model.hidden_size=64", "model.num_hidden_layers=2", "model.vocab_size=512", "train.seq_len=32",
        "train.micro_batch_size=2", "train.device=\"cpu\""]


@pytest.mark.slow
def test_bench_step_runs_only_the_modes_asked_and_refuses_an_unknown_one():
    from typer.testing import CliRunner

    args = ["bench", "step", "--steps", "1", "--backend", "eager", *[a for s in TINY for a in ("--set", s)]]
    result = CliRunner().invoke(app, [*args, "--modes", "eager,compiled"])
    assert result.exit_code == 0, result.output
    modes = re.findall(r"^((?:eager|compiled)(?:-outside|-masked)?) +(?:in model|outside) ", result.output, re.M)
    assert modes == ["eager", "compiled"]  # the two copies only: gpu-check's bench step spares four (two compiles)
    assert "compiled/eager tok/s: " in result.output and "masked/unmasked" not in result.output
    refused = CliRunner().invoke(app, [*args, "--modes", "eager,fast"])
    assert refused.exit_code == 2 and "unknown mode(s) fast; the modes: eager, compiled, " in refused.output


@pytest.mark.slow
def test_bench_step_prints_both_modes_and_their_ratios(capsys):
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["bench", "step", "--steps", "2", "--backend", "eager",
                                      *[a for s in TINY for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "model 64x2 (heads 4/2, vocab 512), seq_len 32, 2 rows x 1 micro-batches, cpu" in out
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^((?:eager|compiled)(?:-outside|-masked)?) +(in model|outside) +([\d,]+) +([\d.]+) +([\d.]+)$", out, re.M)}
    assert set(rows) == {*bench_step.MODES, *bench_step.MASKED_MODES}
    assert all(float(v[1].replace(",", "")) > 0 for v in rows.values())
    assert {mode: v[0] for mode, v in rows.items()} == {**{mode: loss for mode, (_, loss) in bench_step.MODES.items()},
                                                        **dict.fromkeys(bench_step.MASKED_MODES, "in model")}
    assert re.search(r"compiled/eager tok/s: [\d.]+x; host time per step: [\d.]+x; the first compiled step "
                     r"\(compile\) took [\d.]+ s", out)
    assert re.search(r"loss in the model/outside tok/s: compiled [\d.]+x, eager [\d.]+x; compiled \(loss in the "
                     r"graph\)/eager-outside [\d.]+x", out)
    assert re.search(r"masked/unmasked tok/s ratio \(data.doc_mask; below 1x, its cost\): compiled [\d.]+x, "
                     r"eager [\d.]+x", out)

    cfg = bench_step.load(None, TINY)
    eager = bench_step.StepModel(cfg, torch.device("cpu"), compiled=False, backend="eager")
    compiled = bench_step.StepModel(cfg, torch.device("cpu"), compiled=True, backend="eager")
    for _ in range(2):
        eager.step(), compiled.step()
    for a, b in zip(eager.model.parameters(), compiled.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_bench_step_runs_the_trainers_step(monkeypatch):
    """The timed step is trainer/loop/step.py's micro_batch_loss and optimizer_update; the "-outside" copies
    alone score the logits outside the model; both give one model the same update (one loss chunk here)."""
    from minilmd.trainer.loop import step as trainer_step

    calls: list[str] = []
    real_loss, real_update = trainer_step.micro_batch_loss, trainer_step.optimizer_update

    def micro_batch_loss(*args):
        calls.append("loss")
        return real_loss(*args)

    def optimizer_update(*args):
        calls.append("update")
        return real_update(*args)

    monkeypatch.setattr(trainer_step, "micro_batch_loss", micro_batch_loss)
    monkeypatch.setattr(trainer_step, "optimizer_update", optimizer_update)
    cfg = bench_step.load(None, TINY)
    inside = bench_step.StepModel(cfg, torch.device("cpu"), compiled=False, backend="eager")
    outside = bench_step.StepModel(cfg, torch.device("cpu"), compiled=False, backend="eager",
                                   loss=bench_step.LOSS_OUTSIDE)
    inside.step()
    assert calls == ["loss", "update"]
    calls.clear()
    outside.step()
    assert calls == ["update"]
    for a, b in zip(inside.model.parameters(), outside.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_bench_step_refuses_a_bad_config_and_no_steps(capsys):
    assert bench_step.main(None, 2, ["train.compile=\"maybe\""]) == 2
    assert "train.compile = 'maybe'" in capsys.readouterr().err
    assert bench_step.main(None, 0, TINY) == 2


def test_bench_step_masked_copies_train_on_document_pieces():
    """The "-masked" copies: the same rows with document pieces of MiniMind-like lengths, whose first tokens are no
    targets (as the trainer's masked batches), through the same step with the positions."""
    cfg = bench_step.load(None, [*TINY, "train.seq_len=512"])
    plain = bench_step.StepModel(cfg, torch.device("cpu"), compiled=False, backend="eager")
    masked = bench_step.StepModel(cfg, torch.device("cpu"), compiled=False, backend="eager", masked=True)
    assert plain.positions is None and masked.positions is not None and torch.equal(plain.x, masked.x)
    inner_starts = int((masked.positions[:, 1:] == 0).sum())
    assert inner_starts > 0 and bool((masked.positions[:, 0] == 0).all())
    assert plain.n_targets - masked.n_targets == inner_starts
    assert not torch.allclose(plain.micro_batch_loss(), masked.micro_batch_loss())


def test_bench_step_runs_the_kernels_the_loop_runs(capsys):
    # the attention backend settled and applied by the trainer's own functions (here forced, as gpu-check forces the
    # one its part 4 run recorded), determinism as train.deterministic sets it: the loop and the bench time the same
    backends = ("flash", "mem_efficient", "cudnn", "math")
    before = {b: getattr(torch.backends.cuda, f"{b}_sdp_enabled")() for b in backends}
    try:
        code = bench_step.main(None, 1, [*TINY, 'model.attention="math"'], "eager", "eager")
        enabled = {b: getattr(torch.backends.cuda, f"{b}_sdp_enabled")() for b in backends}
    finally:
        for b, on in before.items():
            getattr(torch.backends.cuda, f"enable_{b}_sdp")(on)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "kernels: attention math (forced), deterministic algorithms off (train.deterministic = true applies on " \
           "CUDA only: the cpu's kernels are deterministic already), as `minilmd train` runs them" in out  # on the
    # CPU deterministic mode changes nothing (determinism.apply), and the line says why it is off
    assert enabled == {"flash": False, "mem_efficient": False, "cudnn": False, "math": True}


def test_the_doc_mask_ratio_is_called_its_cost_only_when_the_mask_is_slower():
    """user10 #7: `bench packing` said "1.11x (the cost of data.doc_mask)" of a masked run that was faster."""
    from minilmd.trainer.bench.packing import doc_mask_ratio

    assert doc_mask_ratio(1.11) == "1.11x (data.doc_mask's ratio: no cost measured)"
    assert doc_mask_ratio(0.88) == "0.88x (the cost of data.doc_mask: 12% fewer tokens/s)"
