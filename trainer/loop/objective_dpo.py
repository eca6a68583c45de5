"""The DPO objective (Rafailov et al. 2023), on the objective seam (trainer/loop/objective.py): a preference
corpus's micro-batch holds pairs, rows 2i and 2i + 1 the chosen and rejected sides of pair i (minilmd/plan/pairs.py),
each row's targets its final reply (the loss mask of `prepare --format dpo`).

For each row the policy's log-probability of its reply is summed over the masked tokens (fp32 log-softmax of the tied
head, `chunk_rows` rows at a time, in the cross-entropy objective's checkpointed chunks: trainer/model/loss.py); the
frozen reference's sums of the same rows come with the batch (DeviceBatch.reference, computed once per run:
trainer/loop/dpo_reference.py). With pi_c, pi_r the policy's sums of a pair and ref_c, ref_r the reference's:

    reward_chosen   = beta * (pi_c - ref_c)        reward_rejected = beta * (pi_r - ref_r)
    margin          = reward_chosen - reward_rejected
    loss            = -logsigmoid(margin)

summed over the micro-batch's pairs (the step divides by the global batch's pairs: the sampler counts pairs as its
targets), as MiniMind's train_dpo.py and TRL compute it. At step 0 the policy is the reference: every margin is 0 and
the loss ln 2 = 0.6931. The metrics, TRL's: reward_accuracy (the share of pairs whose chosen reward is above the
rejected one), reward_margin, reward_chosen, reward_rejected (means over the micro-batch's pairs).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minilmd.trainer.model.loss import chunked_row_nll
from minilmd.trainer.model.minimind import MiniMindForCausalLM


def sequence_logps(model: MiniMindForCausalLM, ids: torch.Tensor, labels: torch.Tensor,
                   positions: torch.Tensor | None, chunk_rows: int) -> torch.Tensor:
    """(rows,) fp32: each row's sum of log p(label) over its targeted positions (labels != IGNORE_INDEX), by the
    cross-entropy objective's checkpointed chunks (trainer/model/loss.py chunked_row_nll)."""
    hidden = model(ids, positions=positions, hidden_states=True).hidden
    assert hidden is not None
    return -chunked_row_nll(model.lm_head, hidden, labels, chunk_rows)


def dpo_terms(policy: torch.Tensor, reference: torch.Tensor, beta: float) -> tuple[torch.Tensor, dict]:
    """(loss summed over pairs, metrics) from per-row sums, rows 2i / 2i + 1 a pair's chosen / rejected."""
    reward_chosen = beta * (policy[0::2] - reference[0::2])
    reward_rejected = beta * (policy[1::2] - reference[1::2])
    margin = reward_chosen - reward_rejected
    loss = -F.logsigmoid(margin).sum()
    metrics = {"reward_accuracy": (margin > 0).float().mean(), "reward_margin": margin.mean(),
               "reward_chosen": reward_chosen.mean(), "reward_rejected": reward_rejected.mean()}
    return loss, {name: value.detach() for name, value in metrics.items()}


class DirectPreference:
    """DPO against the per-row reference sums the batch carries (module docstring)."""

    name = "dpo"

    def __init__(self, beta: float, chunk_rows: int):
        self.beta, self.chunk_rows = beta, chunk_rows

    def loss(self, model: MiniMindForCausalLM, batch) -> tuple[torch.Tensor, dict]:
        if batch.reference is None:
            raise RuntimeError("a DPO micro-batch without its reference log-probabilities")
        policy = sequence_logps(model, batch.ids, batch.labels, batch.positions, self.chunk_rows)
        return dpo_terms(policy, batch.reference, self.beta)
