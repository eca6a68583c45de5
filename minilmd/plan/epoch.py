"""One epoch of the train split as the run's sampler cuts it: its rows, the documents they train, what a row holds.

The samplers (samplers.py, bucketing.py, docpacking.py) take their rows per epoch from the same functions
(minilmd/rowcount.py's `epoch_rows`, which prepare's figures count by too; `packed_rows`), chosen by
the same rule (`row_kind`), so the trainer's `items_per_epoch` and the figure `run --check` and `corpus report`
print are one count (tests/test_plan_counts.py compares them mode by mode). Reading a corpus costs its meta.json
only, except for padding-free SFT, whose rows depend on every conversation's length: then train's doc_lengths.npy
too.

A "sample update" is what the reference notes count: a document (a conversation, in a chat corpus) trained once,
whatever the mode. A packed window holds pieces of several documents and a packed row several conversations, so an
epoch trains every document of train once, in fewer rows; a bucketed epoch leaves the last partial bucket out.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minilmd.corpus.format import doc_length_counts
from minilmd.corpus_meta import meta_value
from minilmd.names import DOC_LENGTHS, SPLITS, TOKENS
from minilmd.plan.docpacking import packed_row_count
from minilmd.plan.samplers import row_kind
from minilmd.rowcount import epoch_rows
from minilmd.untrusted import Unreadable


@dataclass(frozen=True)
class Epoch:
    """One epoch of train: `rows` (the sampler's items per epoch), the `documents` they train, and `kind`
    (samplers.row_kind) with the corpus's `unit` ("conversations" or "documents") to say what a row holds."""

    rows: int
    documents: int
    kind: str
    unit: str
    seq_len: int

    def samples(self, rows: int) -> int | None:
        """Documents (conversations) that `rows` rows train: epochs times the documents of one. None for an epoch
        of no rows (too few for one micro-batch: the config check refuses the run, rowcount.too_few_rows), not a
        share of 0 that would hide the update-share warning of the largest micro-batches."""
        return round(rows * self.documents / self.rows) if self.rows else None

    def row_holds(self) -> str:
        """What one row holds, for the figures that count rows."""
        one = self.unit[:-1]
        if self.kind == "windows":
            return f"a window of {self.seq_len:,} tokens across {self.unit}"
        if self.kind == "conversations":
            return f"whole {self.unit} packed into {self.seq_len:,} tokens, {self.documents / self.rows:.1f} a row"
        if self.kind == "pairs":
            return "one pair (its chosen and rejected sides), in buckets of like length"
        return f"one {one}, " + ("padded to seq_len" if self.kind == "padded" else "in buckets of like length")


def epoch_of(kind: str, *, seq_len: int, micro_batch_size: int, seed: int, documents: int, tokens: int,
             length_counts: Callable[[], np.ndarray], unit: str = "documents") -> Epoch:
    """The epoch of a train split of `documents` and `tokens`; `length_counts()`: how many documents have each row
    length (BOS and EOS included, cut at seq_len: train_length_counts), read only for padding-free SFT, whose rows
    docpacking.packed_row_count counts as the sampler packs them."""
    if kind == "conversations":
        rows = packed_row_count(length_counts(), seq_len)
    else:
        rows = epoch_rows(kind, documents=documents, tokens=tokens, seq_len=seq_len, micro_batch_size=micro_batch_size)
        if kind in ("bucketed", "pairs"):
            documents = rows  # the last partial bucket's documents (or pairs) sit the epoch out
    return Epoch(rows, documents, kind, unit, seq_len)


def corpus_epoch(cfg, meta: dict | None, prepared: str | Path | None = None) -> Epoch | None:
    """The epoch of the run `cfg` (as trained: budget.as_trained) on the corpus of `meta` (its meta.json), or None
    when meta.json does not tell (or, for padding-free SFT, train's doc_lengths.npy under `prepared`, default
    data.prepared, cannot be read, or disagrees with what its tokens.bin can hold)."""
    split = meta_value(meta or {}, "splits", "train") or {}
    documents, tokens = split.get("documents"), split.get("tokens")
    if not isinstance(documents, int) or not isinstance(tokens, int):
        return None
    data_format = meta_value(meta or {}, "data_format")
    chat = data_format == "chat"
    kind = "pairs" if data_format == "dpo" else row_kind(cfg.data.mode, cfg.data.doc_mask, chat)
    root = Path(prepared if prepared is not None else cfg.data.prepared)
    try:
        return epoch_of(kind, seq_len=cfg.train.seq_len, micro_batch_size=cfg.train.micro_batch_size,
                        seed=cfg.train.seed, documents=documents, tokens=tokens,
                        length_counts=lambda: train_length_counts(root, documents, tokens, cfg.train.seq_len),
                        unit="pairs" if kind == "pairs" else "conversations" if chat else "documents")
    except (Unreadable, OSError, ValueError):
        return None


def train_length_counts(root: Path, documents: int, tokens: int, seq_len: int) -> np.ndarray:
    """How many of train's documents have each row length (format.doc_length_counts: streamed, bounded by seq_len,
    not by the documents), once meta.json's counts agree with what train's tokens.bin can hold: a document is at
    least one token, each token two bytes of it. ValueError when they do not: a meta.json that lists more documents
    than the corpus holds (a teammate's, to make this read cost more) is not read on."""
    held = os.lstat(root / SPLITS[0] / TOKENS)
    if not stat.S_ISREG(held.st_mode) or not 0 <= documents <= tokens <= held.st_size // 2:
        raise ValueError(f"{root}: meta.json's train split ({documents:,} documents, {tokens:,} tokens) is more than "
                         f"its tokens.bin ({held.st_size:,} bytes) holds")
    return doc_length_counts(root / SPLITS[0] / DOC_LENGTHS, documents, seq_len)
