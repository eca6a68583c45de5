"""The training objective: what a micro-batch's loss is, apart from the loop that minimises it.

An objective is an object with `loss(model, batch) -> (loss, metrics)`: the loss of one micro-batch on the device
(a sum over its targets; the step divides by the global batch's count of targets, trainer/loop/step.py) and named
scalar tensors to report beside it. It calls the model's forward for what it needs (the final hidden states, or the
logits) and computes the loss itself; the model knows nothing of the objective. `build_objective(cfg)` picks it from
the config, as torchtitan's `config.loss.build()` does.

Today's one objective is next-token cross-entropy summed in chunks of rows (ChunkedCrossEntropy, the math in
trainer/model/loss.py): it asks for hidden states and runs the tied head chunk by chunk, so that no logits of the
whole micro-batch exist. `TrainingForward` puts model and objective in one module, which the trainer wraps in DDP and
torch.compile: the loss stays inside the compiled graph and inside DDP's forward, as it was when the model computed it.

A new objective is one more class with its own `loss`, and a line in build_objective: DPO on a preference corpus
(objective_dpo.py, docs/training.md).
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import nn

from minilmd.config import RunConfig
from minilmd.trainer.model.loss import chunk_rows_for, chunked_loss_sum
from minilmd.trainer.model.minimind import MiniMindForCausalLM


class DeviceBatch(NamedTuple):
    """One micro-batch on the device (trainer/loop/step.py to_device)."""

    ids: torch.Tensor
    """(rows, width) int32 token ids."""
    labels: torch.Tensor
    """(rows, width) int64: the next token where it is a target, else IGNORE_INDEX (next_token_labels)."""
    positions: torch.Tensor | None
    """Each token's position within its document piece (data.doc_mask), else None."""
    reference: torch.Tensor | None = None
    """(rows,) fp32: the reference model's sum of log-probabilities over each row's targets (DPO), else None."""


Metrics = dict[str, torch.Tensor]


class Objective(Protocol):
    name: str

    def loss(self, model: MiniMindForCausalLM, batch: DeviceBatch) -> tuple[torch.Tensor, Metrics]: ...


class ChunkedCrossEntropy:
    """Next-token cross-entropy in fp32, summed over the targets, `chunk_rows` rows at a time (trainer/model/loss.py).
    No metrics besides the loss."""

    name = "cross_entropy"

    def __init__(self, chunk_rows: int):
        self.chunk_rows = chunk_rows

    def loss(self, model: MiniMindForCausalLM, batch: DeviceBatch) -> tuple[torch.Tensor, Metrics]:
        hidden = model(batch.ids, positions=batch.positions, hidden_states=True).hidden
        assert hidden is not None
        return chunked_loss_sum(model.lm_head, hidden, batch.labels, self.chunk_rows), {}


def build_objective(cfg: RunConfig, data_format: str = "text") -> Objective:
    """The run's objective for a corpus of `data_format`. Text and chat corpora train next-token cross-entropy, in
    chunks of rows sized from the configured seq_len (a constant of the run, so one compiled graph serves every
    width of a bucketed run). A preference corpus (dpo) trains DPO with `[dpo] beta` (objective_dpo.py)."""
    if data_format == "dpo":
        from minilmd.trainer.loop.objective_dpo import DirectPreference

        return DirectPreference(cfg.dpo.beta, chunk_rows_for(cfg.train.seq_len))
    return ChunkedCrossEntropy(chunk_rows_for(cfg.train.seq_len))


class TrainingForward(nn.Module):
    """The model and its objective as one module: forward(batch) is the objective's (loss, metrics). Its parameters
    are the model's; the objective holds none (a plain object, so no state_dict entry)."""

    def __init__(self, model: MiniMindForCausalLM, objective: Objective):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch: DeviceBatch) -> tuple[torch.Tensor, Metrics]:
        return self.objective.loss(self.model, batch)
