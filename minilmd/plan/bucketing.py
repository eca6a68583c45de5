"""One document per row: MiniMind's static padding to seq_len, and the SFT seed's dynamic padding with length bucketing.

A row is one document (one conversation, in a chat corpus), never two. Text: MiniMind's row, the inner ids cut to
seq_len - 2, then BOS/EOS, so the model always sees a document's end; its targets are every token but the first.
Chat: the conversation as prepared (prepare has already cut it at seq_len, counting the cut ones; a longer one is
cut here the same way), its targets the loss mask, 1 on the assistant replies and their `<|im_end|>`.

Padded (`data.mode = "padded"`): every row padded with PAD (0) to seq_len, the documents of an epoch in the order of
a seeded permutation (the packed sampler's logic over documents, no offset).

Bucketed (`data.mode = "bucketed"`): each epoch e, from numpy's PCG64 seeded with (train.seed, e):
  1. a random permutation of the documents; its first n_docs % micro_batch_size are left out of this epoch (a
     different few each epoch), so that every bucket is full;
  2. the rest sorted by length, stably, so that documents of equal length keep that random order (the seeded tie
     break);
  3. cut into buckets of micro_batch_size consecutive documents: each is one micro-batch;
  4. the buckets in a random order (a second draw of the same generator).
Each micro-batch is padded to the width class of its longest row (minilmd/corpus/analysis/stats.py
width_class: the next multiple of about seq_len / 32, so that torch.compile sees a few shapes, not one per bucket;
`prepare` and `bench sft` count their PAD the same way). Row position p is slot p % mb of bucket p // mb of that
epoch's list, exactly the row positions the packed sampler uses, so the global batch of step s, its split over
ranks and micro-batches, and a bit-exact resume from (seed, step) are the same machinery. A micro-batch starts on a
bucket's first row as long as micro_batch_size stays what it was (a run resumed with another one, after a CUDA
OOM halved it, re-cuts the epochs: rows are then still full and correct, their buckets only less tight).

Why sort and shuffle buckets rather than sample rows (the seed, section 2): padding each batch to its longest row
alone gains almost nothing, because a random batch almost always holds one long document; sorting makes the rows of a
batch alike in length, so that the PAD share falls to a few percent.

The loss is the same either way: PAD positions are never targets and, the attention being causal, never seen by
a real position (tests/test_sft_loss.py proves it for loss and gradients).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from minilmd.config import ConfigError, RunConfig
from minilmd.corpus.analysis.stats import width_class
from minilmd.plan.sampler_base import STREAM_BUCKETS, Batch, DataError, EpochOrder, Sampler, seeded_generator
from minilmd.protocol import BOS_ID, EOS_ID, PAD_ID
from minilmd.replycut import CorpusLies, prepared_at, row_targets, tally
from minilmd.rowcount import RepliesCut, full_buckets, replies_fit, too_few_rows

if TYPE_CHECKING:
    from minilmd.corpus.format import TokenStream


def row_lengths(doc_starts: np.ndarray, seq_len: int) -> np.ndarray:
    """Tokens of each document's row: its length, cut at seq_len (MiniMind's row of a text document is as long,
    BOS and EOS kept)."""
    return np.minimum(np.diff(np.asarray(doc_starts, dtype=np.int64)), seq_len)


class DocumentRows:
    """Rows of single documents and their counts, precomputed once per split: `lengths[d]` (tokens of its row),
    `n_targets[d]` (targets of its row) and, in a chat corpus, `targets_lost[d]` (its targets past seq_len, which
    the row leaves out: replycut.row_targets, the count run --check shows and check_replies_fit judges)."""

    def __init__(self, tokens: np.ndarray, doc_starts: np.ndarray, seq_len: int, loss_mask: np.ndarray | None = None):
        if seq_len < 3:
            raise DataError(f"one document per row needs train.seq_len >= 3 (BOS, one id, EOS), got {seq_len}")
        self.tokens, self.loss_mask, self.seq_len = tokens, loss_mask, seq_len
        self.doc_starts = np.asarray(doc_starts, dtype=np.int64)
        self.n_docs = len(self.doc_starts) - 1
        self.lengths = row_lengths(self.doc_starts, seq_len)
        self.targets_lost: np.ndarray | None = None
        if loss_mask is None:
            self.n_targets = self.lengths - 1
        else:
            self.n_targets, self.targets_lost = row_targets(loss_mask, self.doc_starts, seq_len)

    def replies_cut(self) -> RepliesCut:
        """What seq_len cuts of this chat split's replies, exact (replycut.tally over every cut document)."""
        assert self.targets_lost is not None
        cut = np.diff(self.doc_starts) > self.seq_len
        return tally(self.n_targets[cut], self.targets_lost[cut], self.n_docs,
                     int(self.n_targets.sum()) + int(self.targets_lost.sum()))

    def row(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, targets) of document d's row, unpadded."""
        start, end = int(self.doc_starts[d]), int(self.doc_starts[d + 1])
        if self.loss_mask is not None:
            stop = min(end, start + self.seq_len)
            return (np.asarray(self.tokens[start:stop], dtype=np.uint16),
                    np.asarray(self.loss_mask[start:stop], dtype=np.uint8))
        ids, n = padded_row(self.tokens, start, end, self.seq_len)
        targets = np.ones(n, np.uint8)
        targets[0] = 0
        return ids[:n], targets

    def batch(self, docs: np.ndarray, width: int | None = None) -> Batch:
        """Rows of `docs`, right-padded with PAD to `width` (None: the longest of them)."""
        width = int(self.lengths[docs].max()) if width is None else width
        x = np.full((len(docs), width), PAD_ID, np.uint16)
        targets = np.zeros((len(docs), width), np.uint8)
        for i, d in enumerate(docs):
            ids, t = self.row(int(d))
            x[i, :len(ids)] = ids
            targets[i, :len(t)] = t
        return Batch(x, targets, int(self.n_targets[docs].sum()), int(self.lengths[docs].sum()))

    def counts(self, docs: np.ndarray) -> tuple[int, int]:
        """(targets, real tokens) of these documents' rows, without building them."""
        return int(self.n_targets[docs].sum()), int(self.lengths[docs].sum())


def padded_row(tokens: np.ndarray, doc_start: int, doc_end: int, seq_len: int) -> tuple[np.ndarray, int]:
    """MiniMind's row for one text document: [BOS] inner[:seq_len-2] [EOS] then PAD; returns (row, real length)."""
    inner = np.asarray(tokens[doc_start + 1:doc_end - 1], dtype=np.uint16)[:seq_len - 2]
    row = np.full(seq_len, PAD_ID, dtype=np.uint16)
    n = len(inner) + 2
    row[0] = BOS_ID
    row[1:n - 1] = inner
    row[n - 1] = EOS_ID
    return row, n


class PaddedSampler(Sampler):
    """One document per row, padded to seq_len (MiniMind's way)."""

    mode = "padded"

    def __init__(self, tokens: np.ndarray, doc_starts: np.ndarray, seq_len: int, seed: int,
                 loss_mask: np.ndarray | None = None, order: EpochOrder | None = None):
        self.docs = DocumentRows(tokens, doc_starts, seq_len, loss_mask)
        super().__init__(order.n_items if order else self.docs.n_docs, seq_len, seed, order=order)

    def _too_small_message(self, seq_len: int) -> str:
        return "the train split has no documents"

    def width_of(self, docs: np.ndarray) -> int:
        """Width of the micro-batch of these documents: seq_len."""
        return self.seq_len

    def widest(self) -> int:
        """The widest micro-batch this run's data can give."""
        return self.seq_len

    def micro_batch_widths(self, first_row: int, global_batch: int, micro_batch_size: int) -> set[int]:
        """Widths of the micro-batches of the global batch starting at row first_row, over every rank (each rank
        computes it alone: a rank meeting a new width compiles while the others wait for it)."""
        docs, _ = self.order.items(np.arange(first_row, first_row + global_batch, dtype=np.int64))
        return {self.width_of(docs[i:i + micro_batch_size]) for i in range(0, len(docs), micro_batch_size)}

    def rows(self, positions: np.ndarray) -> Batch:
        docs, _ = self.order.items(positions)
        return self.docs.batch(docs, self.width_of(docs))

    def global_counts(self, first_row: int, global_batch: int) -> tuple[int, int]:
        docs, _ = self.order.items(np.arange(first_row, first_row + global_batch, dtype=np.int64))
        return self.docs.counts(docs)

    def pad_share(self, n_rows: int = 4096, micro_batch_size: int | None = None) -> float:
        """Share of PAD positions over the first n_rows rows of the run, in micro-batches of micro_batch_size rows
        (None: one batch): what padding costs on this corpus."""
        n_rows = min(n_rows, self.items_per_epoch)
        mb = micro_batch_size or n_rows
        real = slots = 0
        for start in range(0, n_rows, mb):
            docs, _ = self.order.items(np.arange(start, min(start + mb, n_rows), dtype=np.int64))
            width = self.width_of(docs)
            real += int(self.docs.lengths[docs].sum())
            slots += width * len(docs)
        return 1.0 - real / slots


class BucketOrder(EpochOrder):
    """Each epoch: documents sorted by length (seeded ties), cut into buckets, buckets shuffled (module docstring)."""

    def __init__(self, lengths: np.ndarray, seed: int, bucket: int):
        self.lengths, self.bucket = lengths, bucket
        super().__init__(full_buckets(len(lengths), bucket), seed)

    def draw(self, e: int) -> tuple[int, np.ndarray]:
        rng = seeded_generator(self.seed, STREAM_BUCKETS, e)
        shuffled = rng.permutation(len(self.lengths))[len(self.lengths) - self.n_items:]
        by_length = shuffled[np.argsort(self.lengths[shuffled], kind="stable")]
        buckets = by_length.reshape(-1, self.bucket)
        return 0, buckets[rng.permutation(len(buckets))].reshape(-1).astype(np.int64)


class BucketedSampler(PaddedSampler):
    """One document per row, micro-batches of documents of similar length, each padded to its longest row's width
    class."""

    mode = "bucketed"

    def __init__(self, tokens: np.ndarray, doc_starts: np.ndarray, seq_len: int, seed: int, micro_batch_size: int,
                 loss_mask: np.ndarray | None = None):
        if micro_batch_size < 1:
            raise DataError(f"bucketed mode needs a micro-batch of at least 1 row, got {micro_batch_size}")
        lengths = DocumentRows(tokens, doc_starts, seq_len).lengths
        unit = "conversations" if loss_mask is not None else "documents"
        if too_few := too_few_rows("bucketed", items=len(lengths), tokens=0, seq_len=seq_len,
                                   micro_batch_size=micro_batch_size, unit=unit):
            raise DataError(too_few)  # run --check's refusal too (minilmd/probes.py): one rule
        self.bucket = micro_batch_size
        super().__init__(tokens, doc_starts, seq_len, seed, loss_mask, order=BucketOrder(lengths, seed,
                                                                                          micro_batch_size))

    def width_of(self, docs: np.ndarray) -> int:
        """The width class of the longest of them."""
        return width_class(int(self.docs.lengths[docs].max()), self.seq_len)

    def widest(self) -> int:
        return width_class(int(self.docs.lengths.max()), self.seq_len)

    def widest_batch(self, micro_batch_size: int) -> Batch:
        """The longest document micro_batch_size times, at the widest width: what the widest micro-batch costs."""
        return self.docs.batch(np.full(micro_batch_size, int(np.argmax(self.docs.lengths)), np.int64), self.widest())


def check_replies_fit(sampler: Sampler, val: TokenStream, meta: dict, cfg: RunConfig, warn: bool) -> None:
    """The trainer's count of what train.seq_len cuts away of an SFT corpus's replies (replycut.py: a row keeps a
    conversation's first seq_len tokens), over every document of both splits, from the rows' own counts
    (DocumentRows.targets_lost): ConfigError (exit 2) when rowcount.replies_fit refuses it (the exact count decides: the
    trainer runs no sampled one), as `run --check` does; DataError (exit 65) when its chat.seq_len is malformed;
    printed as a warning (`warn`: the main rank) when any is cut. Nothing for rows that cut no conversation (packed
    windows, text) nor DPO's pairs (pairs.py)."""
    rows = getattr(sampler, "docs", None)
    if type(rows) is not DocumentRows or rows.targets_lost is None or val.loss_mask is None:
        return
    val_rows = DocumentRows(val.tokens, val.doc_starts, rows.seq_len, val.loss_mask)
    counts = {split: r.replies_cut() for split, r in (("train", rows), ("val", val_rows)) if r.n_docs}
    try:
        at = prepared_at(meta)
    except CorpusLies as e:
        raise DataError(f"data.prepared = {cfg.data.prepared!r}: {e}") from None
    problem, warning = replies_fit(counts, rows.seq_len, at)
    if problem:
        raise ConfigError([f"data.prepared = {cfg.data.prepared!r}: {problem}"], cfg.source)
    if warning and warn:
        print(f"minilmd train: warning: {warning}", flush=True)
