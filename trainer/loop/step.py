"""One optimizer step of the trainer, and its validation loss: the code `minilmd bench step` times as it is.

Everything a step needs is handed over explicitly (StepSetup, the sampler, the step and its first row): no trainer
object is reached into. The loss is the objective's (trainer/loop/objective.py), computed inside the module the
trainer compiles (TrainingForward: model and objective as one), so under torch.compile the head, the fp32 cast and the
cross-entropy are in the graph and no logits of the whole micro-batch are ever built (they were, in fp32, by a loss
computed outside: 1.68 GB at 64 x 1024 x 6400).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import torch

from minilmd.batch_stream import matmul_of
from minilmd.plan.sampler_base import Batch, Sampler
from minilmd.trainer.loop.distributed import Dist
from minilmd.trainer.loop.objective import DeviceBatch, Metrics, Objective
from minilmd.trainer.model.minimind import MiniMindForCausalLM, next_token_labels


class Forward(Protocol):
    """TrainingForward, maybe under DDP and torch.compile: the batch's (loss, metrics)."""

    def __call__(self, batch: DeviceBatch) -> tuple[torch.Tensor, Metrics]: ...

    def no_sync(self) -> AbstractContextManager: ...


@dataclass(frozen=True)
class StepSetup:
    """What every step of this attempt runs with (the Trainer builds it once, Trainer.step_setup)."""

    model: torch.nn.Module
    """The plain model: its parameters are clipped, its gradients dropped."""
    forward: Forward
    optimizer: torch.optim.Optimizer
    dist: Dist
    autocast: Callable[[], AbstractContextManager]
    dynamic_width: bool
    """Bucketed and compiled: the inputs' width is marked dynamic (trainer/loop/warmup.py)."""
    micro_batch_size: int
    grad_accum: int
    global_batch: int
    grad_clip: float


class Gradients(NamedTuple):
    loss_sum: torch.Tensor
    """This rank's part of the mean loss over the global batch's targets."""
    n_real: int
    """Real (non-PAD) tokens of the global batch."""
    metrics: Metrics
    """The objective's metrics, averaged over this rank's micro-batches."""


class StepResult(NamedTuple):
    loss_sum: torch.Tensor
    grad_norm: torch.Tensor
    """Before clipping."""
    n_real: int
    metrics: Metrics


def matmul_dtype(setting: str, device: torch.device) -> str:
    """"bf16" (autocast) or "fp32" (train.dtype; "auto": bf16 on CUDA): what the matrices run in, and so which peak
    MFU is measured against."""
    return matmul_of(setting, device.type == "cuda") or "fp32"  # the rule a resume's dtype change is told by


def autocast_for(matmul: str, device: torch.device) -> Callable[[], AbstractContextManager]:
    if matmul == "bf16":
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext


def mark_width_dynamic(ids: torch.Tensor, dynamic: bool) -> torch.Tensor:
    """Bucketed and compiled: the input's width (dimension 1) is dynamic, so that one graph serves every width
    (maybe_: a model that needs the width static gets a graph per width class rather than an error)."""
    if dynamic:
        torch._dynamo.maybe_mark_dynamic(ids, 1)
    return ids


def _pinned(array: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(array)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def to_device(batch: Batch, device: torch.device, dynamic_width: bool = False) -> DeviceBatch:
    """The batch on the device: one host-to-device copy of the ids, as uint16, and one of the targets (uint8) when
    the batch has them, and of the document-piece positions (data.doc_mask) when it has them; there the ids widen
    to int32 and the int64 labels are derived: the ids shifted by one, IGNORE_INDEX where the next token is no
    target."""
    ids = _pinned(batch.input_ids, device)
    targets = None if batch.targets is None else _pinned(batch.targets, device)
    positions = None if batch.positions is None else _pinned(batch.positions, device)
    ids = mark_width_dynamic(ids.to(torch.int32), dynamic_width)
    labels = mark_width_dynamic(next_token_labels(ids, targets), dynamic_width)  # both: the loss is in the graph
    reference = None if batch.reference is None else _pinned(batch.reference, device)  # DPO's, per row
    return DeviceBatch(ids, labels, positions, reference)


def micro_batch_loss(forward: Forward, batch: DeviceBatch) -> tuple[torch.Tensor, Metrics]:
    """The objective's (loss, metrics) of one micro-batch, computed by `forward` (TrainingForward, or its
    DDP/compiled wrapper)."""
    return forward(batch)


def _add(total: Metrics, metrics: Metrics, scale: int) -> None:
    for name, value in metrics.items():
        value = value.detach() / scale
        total[name] = total[name] + value if name in total else value


def accumulate_gradients(setup: StepSetup, sampler: Sampler, step: int, first_row: int) -> Gradients:
    """Forward/backward over this rank's micro-batches of optimizer step `step`, whose global batch starts at row
    `first_row`.

    Each micro-batch's loss is summed over its targets and divided by the number of targets of the whole
    global batch (sampler.global_counts: every rank computes it alone), times world_size because DDP averages
    gradients over ranks: the gradients are those of the mean loss over every target of the global batch,
    however it is split over ranks and micro-batches, and whatever the padding."""
    dist = setup.dist
    n_targets, n_real = sampler.global_counts(first_row, setup.global_batch)
    loss_sum = torch.zeros((), device=dist.device)
    metrics: Metrics = {}
    for micro in range(setup.grad_accum):
        batch = sampler.batch(step, setup.global_batch, dist.rank, dist.world_size, micro, setup.micro_batch_size,
                              first_row=first_row)
        on_device = to_device(batch, dist.device, setup.dynamic_width)
        sync = micro == setup.grad_accum - 1 or not dist.active
        with (nullcontext() if sync else setup.forward.no_sync()), setup.autocast():
            loss, parts = micro_batch_loss(setup.forward, on_device)
            part = loss / max(n_targets, 1)
        (part * dist.world_size).backward()
        loss_sum += part.detach()
        _add(metrics, parts, setup.grad_accum)
    return Gradients(loss_sum, n_real, metrics)


def optimizer_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> torch.Tensor:
    """Clip (grad_clip <= 0: no clipping, the norm still measured), AdamW step, gradients to None. Returns the
    gradient norm before clipping."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def train_step(setup: StepSetup, sampler: Sampler, step: int, first_row: int, lr: float) -> StepResult:
    """Gradients of this step's global batch (accumulate_gradients) and one AdamW update at the rate `lr`."""
    for group in setup.optimizer.param_groups:
        group["lr"] = lr
    loss_sum, n_real, metrics = accumulate_gradients(setup, sampler, step, first_row)
    return StepResult(loss_sum, optimizer_update(setup.model, setup.optimizer, setup.grad_clip), n_real, metrics)


class Evaluation(NamedTuple):
    loss: float
    """The mean loss over every target of the batches."""
    metrics: dict[str, float]
    """The objective's metrics, averaged over the batches."""


@torch.no_grad()
def evaluate(objective: Objective, model: MiniMindForCausalLM, batches: list[Batch], device: torch.device,
             autocast: Callable[[], AbstractContextManager]) -> Evaluation:
    """The objective over `batches` (rank 0 alone, the plain model: no collectives)."""
    model.eval()
    total, count = 0.0, 0
    metrics: Metrics = {}
    for batch in batches:
        with autocast():
            loss, parts = objective.loss(model, to_device(batch, device))
        total += float(loss)
        count += batch.n_targets
        _add(metrics, parts, max(len(batches), 1))
    model.train()
    return Evaluation(total / max(count, 1), {name: float(value) for name, value in metrics.items()})


def metric_fields(metrics: Metrics | dict[str, float], dist: Dist | None = None, prefix: str = "") -> dict:
    """The objective's metrics as fields of a metrics.jsonl line (rounded, named with `prefix`); with `dist`, the
    tensors averaged over the ranks first (each holds its own micro-batches')."""
    out = {}
    for name, value in metrics.items():
        if dist is not None and dist.active and isinstance(value, torch.Tensor):
            value = value.clone()
            torch.distributed.all_reduce(value)
            value = value / dist.world_size
        out[prefix + name] = round(float(value), 6)
    return out
