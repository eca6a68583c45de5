"""The objective's loss in chunks of rows (ChunkedCrossEntropy, trainer/loop/objective.py and trainer/model/loss.py),
inside the module the trainer compiles (TrainingForward), against the computation it replaced (the whole
micro-batch's logits, then `next_token_loss(logits.float(), labels, "sum")` outside the model).

On CPU in fp32: with one chunk the loss and every gradient are bit-identical to the old computation; with several
the summation order changes and they agree within float rounding. The head never produces logits of more rows
than one chunk; the trainer's own step (Trainer.accumulate_gradients) gives the old loss and gradients, bit for bit.
"""
from __future__ import annotations

import pytest
import torch

from minilmd.config import load_config
from minilmd.trainer.loop import step as optimizer_step
from minilmd.trainer.loop.objective import ChunkedCrossEntropy, DeviceBatch, TrainingForward
from minilmd.trainer.loop.train import Dist, Trainer
from minilmd.trainer.model.loss import chunk_rows_for, next_token_loss
from minilmd.trainer.model.minimind import MiniMindForCausalLM, next_token_labels
from trainer_corpus import write_config

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512, "max_position_embeddings": 64}
ROWS, WIDTH = 4, 16


def tiny_model() -> MiniMindForCausalLM:
    torch.manual_seed(0)
    return MiniMindForCausalLM(TINY)


def fixed_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, TINY["vocab_size"], (ROWS, WIDTH), generator=g)
    targets = (torch.rand(ROWS, WIDTH, generator=g) > 0.3).to(torch.uint8)  # a loss mask, as a chat corpus has
    return ids, next_token_labels(ids, targets)


def old_loss(model, ids, labels) -> torch.Tensor:
    return next_token_loss(model(ids).logits, labels, reduction="sum")


def training(model, chunk_rows: int) -> TrainingForward:
    return TrainingForward(model, ChunkedCrossEntropy(chunk_rows))


def new_loss(forward, ids, labels) -> torch.Tensor:
    """Through the trainer's step function, as the trainer calls it (forward: TrainingForward, maybe compiled)."""
    loss, metrics = optimizer_step.micro_batch_loss(forward, DeviceBatch(ids, labels, None))
    assert metrics == {}
    return loss


def loss_and_grads(model, compute) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = compute()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_one_chunk_is_bit_identical_to_the_loss_outside_the_model():
    model, (ids, labels) = tiny_model(), fixed_batch()
    want, want_grads = loss_and_grads(model, lambda: old_loss(model, ids, labels))
    got, grads = loss_and_grads(model, lambda: new_loss(training(model, ROWS), ids, labels))
    assert torch.equal(got, want)
    assert all(torch.equal(grads[n], want_grads[n]) for n in want_grads)


def test_several_chunks_agree_within_rounding_and_report_the_difference():
    model, (ids, labels) = tiny_model(), fixed_batch()
    want, want_grads = loss_and_grads(model, lambda: old_loss(model, ids, labels))
    got, grads = loss_and_grads(model, lambda: new_loss(training(model, 1), ids, labels))  # 4 chunks of one row
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    worst = max(float((grads[n] - want_grads[n]).abs().max()) for n in want_grads)
    print(f"4 chunks vs the whole batch: loss {float(got - want):+.3e}, worst gradient element {worst:.3e}")
    assert worst <= 1e-6 * max(float(g.abs().max()) for g in want_grads.values())


def test_no_logits_of_the_whole_micro_batch_exist():
    """The head's outputs, forward and backward's recompute, are at most one chunk of rows: no (rows x vocab)
    tensor of the whole micro-batch, in fp32 or any dtype; the model returns no logits on this path. The last chunk
    is not recomputed (its backward runs first), and so neither is a micro-batch of one chunk."""
    model, (ids, labels) = tiny_model(), fixed_batch()
    shapes: list[tuple[int, ...]] = []
    model.lm_head.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    out = model(ids, hidden_states=True)  # what the objective asks the model for: no logits
    assert out.logits is None and out.loss is None and out.hidden is not None and not shapes
    new_loss(training(model, 1), ids, labels).backward()
    assert shapes == [(1, WIDTH, TINY["vocab_size"])] * (2 * ROWS - 1)  # each chunk once, recomputed but the last
    shapes.clear()
    with torch.no_grad():
        new_loss(training(model, 2), ids, labels)
    assert shapes == [(2, WIDTH, TINY["vocab_size"])] * 2  # no recompute without a backward
    shapes.clear()
    new_loss(training(model, ROWS), ids, labels).backward()
    assert shapes == [(ROWS, WIDTH, TINY["vocab_size"])]


def test_chunk_rows_keep_about_the_chunk_tokens_and_at_least_one_row():
    assert chunk_rows_for(1024) == 8 and chunk_rows_for(128) == 64
    assert chunk_rows_for(100_000) == 1 and chunk_rows_for(0) >= 1


def test_bf16_autocast_on_cpu_matches_within_bf16_tolerance():
    model, (ids, labels) = tiny_model(), fixed_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = old_loss(model, ids, labels)
        got = new_loss(training(model, 1), ids, labels)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-2, atol=0)


@pytest.mark.slow
def test_the_loss_is_inside_one_compiled_graph():
    """fullgraph=True: the chunked loss and its checkpointing trace without a graph break (aot_eager: no code
    generation on a CPU test), to the same loss and gradients."""
    model, (ids, labels) = tiny_model(), fixed_batch()
    want, want_grads = loss_and_grads(model, lambda: new_loss(training(model, 2), ids, labels))
    compiled = torch.compile(training(model, 2), backend="aot_eager", fullgraph=True)
    got, grads = loss_and_grads(model, lambda: new_loss(compiled, ids, labels))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    for n in want_grads:
        torch.testing.assert_close(grads[n], want_grads[n], rtol=1e-5, atol=1e-7)


def test_the_trainers_step_gives_the_old_loss_and_gradients_bit_for_bit(tmp_path, corpus):
    config = write_config(tmp_path, corpus, name="chunked",
                          train={"seq_len": 64, "micro_batch_size": 4, "grad_accum": 2, "max_steps": 1})
    t = Trainer(load_config(config), Dist(0, 1, 0, torch.device("cpu")))
    assert t.objective.chunk_rows >= 4  # one chunk per micro-batch: the bit-exact case
    n_targets, _ = t.sampler.global_counts(t.first_row(0), t.global_batch)
    want = torch.zeros(())
    for micro in range(2):
        batch = t.sampler.batch(0, t.global_batch, micro=micro, micro_batch_size=4, first_row=t.first_row(0))
        x, y, _, _ = t.to_device(batch)
        part = next_token_loss(t.model(x).logits, y, reduction="sum") / n_targets
        part.backward()
        want += part.detach()
    want_grads = {n: p.grad.clone() for n, p in t.model.named_parameters()}
    t.model.zero_grad(set_to_none=True)
    loss, _ = t.accumulate_gradients(0)
    assert torch.equal(loss, want)
    assert all(torch.equal(p.grad, want_grads[n]) for n, p in t.model.named_parameters())


def old_dpo_logps(model, ids, labels, chunk_rows: int) -> torch.Tensor:
    """objective_dpo.sequence_logps as it was, with its own chunk loop and no checkpointing (construct report 11)."""
    import torch.nn.functional as F

    hidden = model(ids, hidden_states=True).hidden
    sums = []
    for start in range(0, hidden.shape[0], chunk_rows):
        h, y = hidden[start:start + chunk_rows], labels[start:start + chunk_rows]
        logits = model.lm_head(h).float()
        nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="none")
        sums.append(-nll.view(y.shape).sum(dim=1))
    return torch.cat(sums)


def dpo_loss(model, logps) -> torch.Tensor:
    from minilmd.trainer.loop.objective_dpo import dpo_terms

    reference = torch.linspace(-60.0, -40.0, ROWS)  # any fixed per-row sums: the reference pass's stand-in
    return dpo_terms(logps, reference, beta=0.1)[0]


@pytest.mark.parametrize("chunk_rows", [1, 3, ROWS])
def test_dpo_through_the_shared_chunks_is_bit_identical_to_its_own_loop_before(chunk_rows):
    """DPO's per-row log-probabilities come from loss.py's chunks (chunked_row_nll), the cross-entropy objective's:
    its loss, its per-row sums and every gradient are those of its old loop, bit for bit, on CPU."""
    from minilmd.trainer.loop.objective_dpo import sequence_logps

    model, (ids, labels) = tiny_model(), fixed_batch()
    want_logps = old_dpo_logps(model, ids, labels, chunk_rows).detach()
    want, want_grads = loss_and_grads(model, lambda: dpo_loss(model, old_dpo_logps(model, ids, labels, chunk_rows)))
    got_logps = sequence_logps(model, ids, labels, None, chunk_rows).detach()
    got, grads = loss_and_grads(model, lambda: dpo_loss(model, sequence_logps(model, ids, labels, None, chunk_rows)))
    assert torch.equal(got_logps, want_logps) and torch.equal(got, want)
    assert all(torch.equal(grads[n], want_grads[n]) for n in want_grads)


def test_dpo_keeps_one_chunk_of_logits_for_its_backward():
    """DPO's chunks but the last are checkpointed as the cross-entropy's are: their logits are recomputed in the
    backward rather than kept (before, every chunk's fp32 logits lived until the backward: every row's)."""
    from minilmd.trainer.loop.objective_dpo import sequence_logps

    model, (ids, labels) = tiny_model(), fixed_batch()
    shapes: list[tuple[int, ...]] = []
    model.lm_head.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    dpo_loss(model, sequence_logps(model, ids, labels, None, 1)).backward()
    assert shapes == [(1, WIDTH, TINY["vocab_size"])] * (2 * ROWS - 1)  # each chunk once, recomputed but the last
    shapes.clear()
    with torch.no_grad():  # the reference pass (trainer/loop/dpo_reference.py): no backward, no recompute
        sequence_logps(model, ids, labels, None, 2)
    assert shapes == [(2, WIDTH, TINY["vocab_size"])] * 2
