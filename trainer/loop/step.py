"""One optimizer step of the trainer, and its validation loss: the code `minilmd bench step` times as it is.

The loss is computed inside the module the trainer compiles (MiniMindForCausalLM.forward with next_labels, summed
over the targets in chunks of rows: trainer/model/loss.py), so under torch.compile the head, the fp32 cast and the
cross-entropy are in the graph and no logits of the whole micro-batch are ever built (they were, in fp32, by a loss
computed outside: 1.68 GB at 64 x 1024 x 6400).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from minilmd.plan.schedule import lr_at
from minilmd.trainer.model.loss import chunk_rows_for


def micro_batch_loss(forward: Any, x: torch.Tensor, next_labels: torch.Tensor, chunk_rows: int,
                     positions: torch.Tensor | None = None) -> torch.Tensor:
    """The sum over this micro-batch's targets of the fp32 cross-entropy, computed by `forward` (the model, or its
    DDP/compiled wrapper) itself. positions: the rows' document pieces (data.doc_mask), else None."""
    if positions is None:  # the call as it is without data.doc_mask, to the letter
        return forward(x, next_labels=next_labels, chunk_rows=chunk_rows).loss
    return forward(x, next_labels=next_labels, chunk_rows=chunk_rows, positions=positions).loss


def positions_to_device(trainer: Any, batch: Any) -> torch.Tensor | None:
    """The batch's document-piece positions (data.doc_mask: minilmd/plan/docmask.py) on the device, copied like
    its ids (pinned, non-blocking on CUDA); None without them."""
    if batch.positions is None:
        return None
    positions = torch.from_numpy(batch.positions)
    if trainer.device.type == "cuda":
        return positions.pin_memory().to(trainer.device, non_blocking=True)
    return positions


def loss_chunk_rows(trainer: Any) -> int:
    """Sequences per loss chunk: from the configured seq_len (a constant of the run, so one compiled graph serves
    every width of a bucketed run)."""
    return chunk_rows_for(trainer.cfg.train.seq_len)


def accumulate_gradients(trainer: Any, step: int) -> tuple[torch.Tensor, int]:
    """Forward/backward over this rank's micro-batches of optimizer step `step`.

    Each micro-batch's loss is summed over its targets and divided by the number of targets of the whole
    global batch (sampler.global_counts: every rank computes it alone), times world_size because DDP averages
    gradients over ranks: the gradients are those of the mean loss over every target of the global batch,
    however it is split over ranks and micro-batches, and whatever the padding. Returns (this rank's part of
    the loss, real tokens of the global batch)."""
    t, dist = trainer.cfg.train, trainer.dist
    row0 = trainer.first_row(step)
    n_targets, n_real = trainer.sampler.global_counts(row0, trainer.global_batch)
    chunk_rows = loss_chunk_rows(trainer)
    loss_sum = torch.zeros((), device=trainer.device)
    for micro in range(t.grad_accum):
        batch = trainer.sampler.batch(step, trainer.global_batch, dist.rank, dist.world_size, micro,
                                      t.micro_batch_size, first_row=row0)
        x, y = trainer.to_device(batch)
        positions = positions_to_device(trainer, batch)
        sync = micro == t.grad_accum - 1 or not dist.active
        with (nullcontext() if sync else trainer.forward_model.no_sync()), trainer.autocast():
            part = micro_batch_loss(trainer.forward_model, x, y, chunk_rows, positions) / max(n_targets, 1)
        (part * dist.world_size).backward()
        loss_sum += part.detach()
    return loss_sum, n_real


def optimizer_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> torch.Tensor:
    """Clip (grad_clip <= 0: no clipping, the norm still measured), AdamW step, gradients to None. Returns the
    gradient norm before clipping."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def train_step(trainer: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Gradients of this step's global batch (accumulate_gradients) and one AdamW update at this step's rate.
    Returns (this rank's part of the loss, grad norm, real tokens of the global batch)."""
    t, step = trainer.cfg.train, trainer.step
    lr = lr_at(step, trainer.total_steps, t.lr, t.min_lr_ratio, t.warmup_steps)
    for group in trainer.optimizer.param_groups:
        group["lr"] = lr
    trainer.current_lr = lr
    loss_sum, n_real = accumulate_gradients(trainer, step)
    return loss_sum, optimizer_update(trainer.model, trainer.optimizer, t.grad_clip), n_real


@torch.no_grad()
def evaluate(trainer: Any, batches: list) -> float:
    """Mean loss over every target of `batches` (rank 0 alone, the plain model: no collectives)."""
    trainer.model.eval()
    total, count = 0.0, 0
    chunk_rows = loss_chunk_rows(trainer)
    for batch in batches:
        x, y = trainer.to_device(batch)
        with trainer.autocast():
            total += float(micro_batch_loss(trainer.model, x, y, chunk_rows, positions_to_device(trainer, batch)))
        count += batch.n_targets
    trainer.model.train()
    return total / max(count, 1)
