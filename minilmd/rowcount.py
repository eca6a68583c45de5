"""How many rows one epoch of the train split holds, and how many optimizer steps those rows make: the rules the
samplers (minilmd/plan/), the step budget (plan/budget.py) and prepare's figures (corpus/analysis/stats.py, kept in
meta.json) count by. In the core's base, below both the corpus tools and the plan, so that each calls these and none
keeps a copy (issue 43: prepare's report said 10 steps an epoch where the packed sampler takes 11)."""
from __future__ import annotations

import math

from minilmd.config_sections import ONE_DOCUMENT_A_ROW


def packed_windows(n_tokens: int, seq_len: int) -> int:
    """Windows of one epoch of packed mode: as many as fit every epoch's offset (the sampler shifts the window
    edges by a random offset in [0, seq_len) each epoch: minilmd/plan/samplers.py)."""
    return max(0, (n_tokens - seq_len + 1) // seq_len)


def kind_of_rows(mode: str, doc_mask: bool, chat: bool) -> str:
    """What a row of `data.mode` is (plan/samplers.row_kind, which refuses the ""): "windows" (packed),
    "conversations" (packed with doc_mask on a chat corpus), "padded" or "bucketed" (one document per row); "" for a
    mode there is not."""
    if mode == "packed":
        return "conversations" if doc_mask and chat else "windows"
    return mode if mode in ONE_DOCUMENT_A_ROW else ""


def packed_too_small(n_tokens: int, seq_len: int) -> str:
    """Why a train split of `n_tokens` holds no packed window at `seq_len` ("" when it holds one): the sampler's
    refusal (minilmd/plan/samplers.py), the config check's (minilmd/probes.py) and prepare's warning."""
    if packed_windows(n_tokens, seq_len) > 0:
        return ""
    return (f"the train split has {n_tokens:,} tokens; packed mode needs at least 2 x seq_len = {2 * seq_len:,} "
            f"(lower train.seq_len or prepare a larger corpus)")


def full_buckets(n_docs: int, bucket: int) -> int:
    """Rows of one epoch of bucketed mode: the documents of the full buckets (n_docs % bucket sit each epoch out)."""
    return n_docs - n_docs % bucket


def epoch_rows(kind: str, *, documents: int, tokens: int, seq_len: int, micro_batch_size: int) -> int:
    """Rows of one epoch for a row kind that meta.json's counts tell (plan/samplers.row_kind): "windows" (packed),
    "bucketed" (buckets of micro_batch_size), "padded" (one document a row) or "pairs" (a preference corpus's pairs,
in buckets). Padding-free SFT's "conversations"
    depend on every conversation's length: plan/epoch.py's epoch_of."""
    if kind == "windows":
        return packed_windows(tokens, seq_len)
    if kind == "bucketed":
        return full_buckets(documents, max(micro_batch_size, 1))
    if kind == "padded":
        return documents
    if kind == "pairs":  # a preference corpus: a row (item) is a pair of documents (minilmd/plan/pairs.py)
        return full_buckets(documents // 2, max(micro_batch_size, 1))
    raise ValueError(f"rows of {kind!r} are not counted from meta.json alone")


def steps_for_rows(rows: int, global_batch: int, epochs: float = 1) -> int:
    """Optimizer steps that `epochs` epochs of `rows` rows take at `global_batch` rows a step: the last step of a
    budget may reach into the next epoch (the samplers continue across epochs), so a started batch counts; 0 for
    no rows."""
    return max(1, math.ceil(epochs * rows / global_batch)) if rows and global_batch else 0
