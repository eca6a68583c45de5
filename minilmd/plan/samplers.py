"""Batches for training and validation: a pure function of (seed, step), no state to carry but the step.

Packed mode (default). A window is `seq_len` consecutive tokens of the train stream, used both as input and as
labels: the model shifts inside (logits[:, :-1] against labels[:, 1:]), so a window of `seq_len` tokens trains
`seq_len - 1` predictions. We chose `seq_len` tokens rather than `seq_len + 1` so that a row has exactly the shape
the model sees (the same (B, seq_len) tensor as in padded mode and in MiniMind, and `seq_len` is also the longest
sequence the model must handle); the price is one prediction in 340 per window. Windows cross document boundaries
on purpose: the stream holds `[BOS] doc [EOS]` for every document, so the model sees the boundaries.
With `data.doc_mask` the same windows also carry their document pieces (minilmd/plan/docmask.py): attention
and rotary positions stay within each document, and the EOS -> next BOS prediction is no target.

Epochs. Epoch e uses the window starts `offset_e + k * seq_len` for k in [0, n_windows), visited in the order of a
permutation; offset_e in [0, seq_len) moves the window edges from one epoch to the next. Both are drawn from
numpy's PCG64 seeded with (seed, epoch) explicitly. `n_windows = (n_tokens - seq_len + 1) // seq_len` fits every
offset, so every epoch has the same number of windows (at most one window's worth of tokens at the end of the
stream is skipped in a given epoch, a different one each epoch).

Global batches. Row position p of the whole run is entry p % n of epoch p // n's permutation (n = windows per
epoch): the infinite concatenation of epoch permutations. The global batch of optimizer step s is positions
[s*G, (s+1)*G), G = micro_batch_size * grad_accum * world_size. Rank r of w takes the contiguous slice
[r*G/w, (r+1)*G/w) of those rows, and its micro-batch m the slice [m*mb, (m+1)*mb) of its own rows. So the global
batch is the same whatever the number of ranks that divides it, and a resumed run sees exactly the batches an
uninterrupted one would have seen.

One document per row (`data.mode = "padded"`, MiniMind's static padding to seq_len, and `"bucketed"`, dynamic
padding with length bucketing, the SFT seed's method): minilmd/plan/bucketing.py, on the same row positions.

Chat corpora carry a loss mask (`TokenStream.loss_mask`, 1 on assistant reply tokens): a batch's `targets` is that
mask cut like its rows, and only those tokens are predicted. Text corpora have none: every real next token is.

Validation: a fixed set of windows (or documents) of the val split drawn with a fixed seed that does not depend on
the run's seed, so that val losses are comparable over time and across runs with the same seq_len.

Every batch also carries `n_targets`, the number of predictions its loss sums over; the trainer divides the summed
loss of each micro-batch by the global batch's count, so that the step's loss is the mean over all predicted tokens
of the global batch, whatever the split into ranks and micro-batches.
"""
from __future__ import annotations

import numpy as np

from minilmd.config_sections import DATA_MODES, ONE_DOCUMENT_A_ROW
from minilmd.plan.bucketing import BucketedSampler, DocumentRows, PaddedSampler
from minilmd.plan.docmask import piece_targets, window_positions
from minilmd.plan.docpacking import PackedConversationsSampler
from minilmd.plan.sampler_base import STREAM_VALIDATION, Batch, DataError, Sampler, seeded_generator
from minilmd.rowcount import kind_of_rows, packed_too_small, packed_windows

VAL_SEED = 0x5EED_7A1  # fixed: val windows do not move when the run's seed changes


def row_kind(mode: str, doc_mask: bool, chat: bool) -> str:
    """Which sampler cuts the rows of `data.mode`: "windows" (packed), "conversations" (packed with doc_mask on a
    chat corpus: padding-free SFT), "padded" or "bucketed" (one document per row). make_sampler and the core's
    count of an epoch (minilmd/plan/epoch.py) both follow it (minilmd/rowcount.py's rule, which the config check
    asks too)."""
    if kind := kind_of_rows(mode, doc_mask, chat):
        return kind
    raise DataError(f"data.mode = {mode!r}: must be one of {', '.join(DATA_MODES)}")


def window_batch(tokens: np.ndarray, loss_mask: np.ndarray | None, starts: np.ndarray, length: int,
                 doc_starts: np.ndarray | None = None) -> Batch:
    """Windows of `length` stream tokens (and their loss mask, for a chat corpus) starting at `starts`; with
    `doc_starts` (data.doc_mask) also the positions of their document pieces (minilmd/plan/docmask.py)."""
    x = np.stack([np.asarray(tokens[s:s + length], dtype=np.uint16) for s in starts])
    targets = None
    if loss_mask is not None:
        targets = np.stack([np.asarray(loss_mask[s:s + length], dtype=np.uint8) for s in starts])
    if doc_starts is not None:
        positions = window_positions(starts, length, doc_starts)
        targets = piece_targets(positions, targets)
        return Batch(x, targets, int(targets[:, 1:].sum()), x.size, positions)
    if targets is None:
        return Batch(x, None, len(starts) * (length - 1), x.size)
    return Batch(x, targets, int(targets[:, 1:].sum()), x.size)


class PackedSampler(Sampler):
    """Fixed windows of seq_len tokens cut from the stream, across document boundaries; with `doc_starts`
    (data.doc_mask) each row also carries its document pieces' positions."""

    mode = "packed"

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int, loss_mask: np.ndarray | None = None,
                 doc_starts: np.ndarray | None = None):
        self.tokens = tokens
        self.loss_mask = loss_mask
        self.doc_starts = doc_starts
        self.n_tokens = int(len(tokens))
        super().__init__(packed_windows(self.n_tokens, seq_len), seq_len, seed, offset_range=seq_len)

    def _too_small_message(self, seq_len: int) -> str:
        return packed_too_small(self.n_tokens, seq_len)

    def window_starts(self, positions: np.ndarray) -> np.ndarray:
        idx, offsets = self.order.items(positions)
        return offsets + idx * self.seq_len

    def global_counts(self, first_row: int, global_batch: int) -> tuple[int, int]:
        if self.loss_mask is not None or self.doc_starts is not None:
            return super().global_counts(first_row, global_batch)
        return global_batch * (self.seq_len - 1), global_batch * self.seq_len  # every window is full

    def rows(self, positions: np.ndarray) -> Batch:
        return window_batch(self.tokens, self.loss_mask, self.window_starts(positions), self.seq_len,
                            self.doc_starts)


def make_sampler(mode: str, tokens: np.ndarray, doc_starts: np.ndarray, seq_len: int, seed: int,
                 loss_mask: np.ndarray | None = None, micro_batch_size: int = 1, doc_mask: bool = False) -> Sampler:
    """The sampler of `data.mode`; `loss_mask` for a chat corpus; `micro_batch_size` is the bucket size of
    bucketed mode (one micro-batch is one bucket); `doc_mask` (packed only) gives rows their document pieces, and
    on a chat corpus packs whole conversations instead of cutting windows (padding-free SFT: docpacking.py)."""
    kind = row_kind(mode, doc_mask, loss_mask is not None)
    if kind == "conversations":
        return PackedConversationsSampler(tokens, doc_starts, seq_len, seed, loss_mask)
    if kind == "windows":
        return PackedSampler(tokens, seq_len, seed, loss_mask, doc_starts if doc_mask else None)
    if kind == "padded":
        return PaddedSampler(tokens, doc_starts, seq_len, seed, loss_mask)
    return BucketedSampler(tokens, doc_starts, seq_len, seed, micro_batch_size, loss_mask)


def validation_batches(mode: str, tokens: np.ndarray, doc_starts: np.ndarray, seq_len: int, n_windows: int,
                       batch_size: int, loss_mask: np.ndarray | None = None, doc_mask: bool = False) -> list[Batch]:
    """The fixed validation set: n_windows windows (packed) or documents (padded, bucketed) of the val split, drawn
    with VAL_SEED, in batches of batch_size rows. A val split shorter than one window gives one shorter row.
    doc_mask: packed windows carry their document pieces (the same windows, scored as the run trains); on a chat
    corpus (padding-free SFT) the padded mode's rows, one conversation each: the masked rows compute the same loss,
    comparable with a bucketed or padded run's."""
    n_tokens = int(len(tokens))
    if n_tokens < 2:
        raise DataError(f"the val split has {n_tokens} tokens; at least 2 are needed for a validation loss")
    rng = seeded_generator(VAL_SEED, STREAM_VALIDATION, 0)
    if mode == "packed" and doc_mask and loss_mask is not None:
        mode = "padded"
    if mode in ONE_DOCUMENT_A_ROW:
        docs_rows = DocumentRows(tokens, doc_starts, seq_len, loss_mask)
        n_docs = len(doc_starts) - 1
        docs = np.sort(rng.choice(n_docs, size=min(n_windows, n_docs), replace=False))
        width: int | None = seq_len
        if mode == "bucketed":  # the same documents, grouped by length and padded to each batch's longest
            docs, width = docs[np.argsort(docs_rows.lengths[docs], kind="stable")], None
        return [docs_rows.batch(docs[i:i + batch_size], width) for i in range(0, len(docs), batch_size)]
    length = min(seq_len, n_tokens)
    available = n_tokens // length
    starts = np.sort(rng.choice(available, size=min(n_windows, available), replace=False)) * length
    return [window_batch(tokens, loss_mask, starts[i:i + batch_size], length, doc_starts if doc_mask else None)
            for i in range(0, len(starts), batch_size)]
