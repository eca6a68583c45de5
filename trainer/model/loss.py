"""The training loss: next-token cross-entropy summed over the targets, in chunks of rows, computed by the objective
(trainer/loop/objective.py, ChunkedCrossEntropy) from the model's hidden states inside the compiled module.

Why chunks: scoring a whole micro-batch at once materialises its logits in fp32 (64 x 1024 rows x 6400 = 1.68 GB),
and keeps them alive for the backward. Here the head and the loss run on `chunk_rows` sequences at a time (about
CHUNK_TOKENS tokens), each chunk but the last under activation checkpointing: the forward keeps only the chunk's
scalar loss, the backward recomputes that chunk's logits (one more head matmul for it; in all at most ~2.5 % of a
768 x 8 model's step FLOPs) and frees them before the next. The last chunk keeps what its backward needs, which runs
first; so at most about two chunks of logits exist at any time, and a micro-batch of one chunk recomputes nothing.

Why chunks of whole sequences (dimension 0), not of flattened tokens: the batch dimension is static while a bucketed
run's width is dynamic under torch.compile (trainer/loop/warmup.py); a chunk count that depends on the width would
recompile the graph for every width class. `chunk_rows` comes from the configured seq_len, a constant of the run.

The same chunks give each sequence's own sum (chunked_row_nll), the per-row log-probabilities of DPO: its loss
keeps the same memory bound.

Bit-exactness: with one chunk (chunk_rows >= rows of the micro-batch, as in every tiny test) the ops are those of
`next_token_loss(logits, labels, "sum")` on the whole batch, and the loss and gradients are bit-identical to it.
With several chunks the sum over targets and the head's weight gradient are added up chunk by chunk: another
summation order, equal within float rounding (tests/test_chunked_loss.py measures it), the same on every run.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from minilmd.plan.footprint import CHUNK_TOKENS as CHUNK_TOKENS  # the chunks' one home: the memory estimate counts them
from minilmd.plan.footprint import chunk_rows_for as chunk_rows_for
from minilmd.plan.sampler_base import IGNORE_INDEX as IGNORE_INDEX  # the labels' one home: the sampler writes them


def next_token_loss(logits: torch.Tensor, next_labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy in fp32 of (batch, time, vocab) logits against already shifted labels (next_token_labels)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), next_labels.flatten(), ignore_index=IGNORE_INDEX,
                           reduction=reduction)


def _chunk_loss(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                next_labels: torch.Tensor) -> torch.Tensor:
    return next_token_loss(head(hidden), next_labels, reduction="sum")


def _chunk_row_nll(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                   next_labels: torch.Tensor) -> torch.Tensor:
    nll = next_token_loss(head(hidden), next_labels, reduction="none")
    return nll.view(next_labels.shape).sum(dim=1)


def _by_chunks(score: Callable[..., torch.Tensor], head: Callable[[torch.Tensor], torch.Tensor],
               hidden: torch.Tensor, next_labels: torch.Tensor, chunk_rows: int) -> list[torch.Tensor]:
    """score(head, hidden, next_labels) of each chunk of `chunk_rows` sequences, every chunk but the last under
    activation checkpointing where a backward will follow (module docstring): the one chunk loop of both losses."""
    rows = hidden.shape[0]
    assert rows > 0, "an empty micro-batch"
    parts = []
    for start in range(0, rows, chunk_rows):
        h, y = hidden[start:start + chunk_rows], next_labels[start:start + chunk_rows]
        last = start + chunk_rows >= rows  # its backward runs first, at once: nothing to gain by recomputing it
        if torch.is_grad_enabled() and not last:
            parts.append(checkpoint(score, head, h, y, use_reentrant=False, preserve_rng_state=False))
        else:
            parts.append(score(head, h, y))
    return parts


def chunked_loss_sum(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, next_labels: torch.Tensor,
                     chunk_rows: int) -> torch.Tensor:
    """Sum over targets of the fp32 cross-entropy of head(hidden) (batch, time, hidden) against next_labels
    (batch, time; IGNORE_INDEX = no target), `chunk_rows` sequences at a time (module docstring)."""
    parts = _by_chunks(_chunk_loss, head, hidden, next_labels, chunk_rows)
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def chunked_row_nll(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, next_labels: torch.Tensor,
                    chunk_rows: int) -> torch.Tensor:
    """(batch,) fp32: each sequence's sum over its targets of the cross-entropy of head(hidden) (its negative
    log-probability of its targets: DPO's, trainer/loop/objective_dpo.py), in the same checkpointed chunks."""
    return torch.cat(_by_chunks(_chunk_row_nll, head, hidden, next_labels, chunk_rows))
