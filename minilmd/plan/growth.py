"""A run resumed on a corpus that grew by `prepare --append`: the rows already planned stay as they were.

The sampler maps a global row position to a row as a pure function of (seed, position) over the train split it
was built on (samplers.py); the same position over a longer split is another row. So the run's rows are cut into
segments, each read from one version of the corpus:

    segment i = (first_row_i, first_epoch_i, the version's train documents and tokens)
    row p of segment i = row (p - first_row_i) + first_epoch_i * n_i of a sampler over that version's prefix of
                         train (n_i: its rows per epoch)

A run starts with one segment (row 0, epoch 0, the corpus it started on). Resumed on a grown corpus (the
checkpoint's data fingerprint is one of the corpus's earlier versions, minilmd/corpus/format.py), it keeps reading its
last segment until the end of the epoch the checkpoint is in, and a new segment over the whole corpus starts at
the next epoch's first row and epoch number: the new documents come in from the next epoch on. The rows before
that boundary are the very rows of an undisturbed run on the old corpus, bit for bit (a version's prefix of
train holds the same tokens: an append never rewrites them). The segments travel in trainer_state.json
("data_segments"), so later resumes rebuild the same mapping; a run without them has the one segment.
"""
from __future__ import annotations

import numpy as np

from minilmd.plan.sampler_base import Batch, DataError, Sampler
from minilmd.plan.samplers import make_sampler
from minilmd.plan.trainer_state import rows_seen


class SegmentedSampler(Sampler):
    """Rows from a list of segments (the module docstring); Sampler.batch works through rows()."""

    def __init__(self, segments: list[dict], samplers: list[Sampler]):
        self.segments, self.samplers = segments, samplers
        self.seq_len = samplers[-1].seq_len
        self.seed = samplers[-1].seed
        self.mode = samplers[-1].mode
        self.order = samplers[-1].order
        self.firsts = np.array([s["first_row"] for s in segments], dtype=np.int64)

    @property
    def items_per_epoch(self) -> int:
        return self.samplers[-1].items_per_epoch

    def rows(self, positions: np.ndarray) -> Batch:
        seg = np.searchsorted(self.firsts, positions, side="right") - 1
        parts: list[tuple[np.ndarray, Batch]] = []
        for i in np.unique(seg):
            sel = np.flatnonzero(seg == i)
            s, sampler = self.segments[int(i)], self.samplers[int(i)]
            local = positions[sel] - s["first_row"] + s["first_epoch"] * sampler.items_per_epoch
            parts.append((sel, sampler.rows(local)))
        if len(parts) == 1:
            return parts[0][1]
        # rows of two versions in one batch (the epoch boundary inside it): one array, the narrower rows padded
        width = max(b.input_ids.shape[1] for _, b in parts)
        ids = np.zeros((positions.size, width), dtype=np.uint16)
        targets = np.zeros((positions.size, width), dtype=np.uint8)
        masked = parts[0][1].positions is not None  # doc_mask: every segment's rows carry their pieces
        pieces = np.zeros((positions.size, width), dtype=np.int32) if masked else None
        for sel, b in parts:
            w = b.input_ids.shape[1]
            ids[sel, :w] = b.input_ids
            if b.targets is None:  # packed text windows: every token but the first is a target
                targets[sel, 1:w] = 1
            else:
                targets[sel, :w] = b.targets
            if pieces is not None and b.positions is not None:
                pieces[sel, :w] = b.positions
        return Batch(ids, targets, sum(b.n_targets for _, b in parts), sum(b.n_real_tokens for _, b in parts),
                     pieces)

    def global_counts(self, first_row: int, global_batch: int) -> tuple[int, int]:
        b = self.rows(np.arange(first_row, first_row + global_batch, dtype=np.int64))
        return b.n_targets, b.n_real_tokens


def one_segment(corpus) -> list[dict]:
    """The segments of a run that starts on `corpus`."""
    return [_segment(0, 0, corpus.data_fingerprint, corpus.meta["splits"]["train"])]


def _segment(first_row: int, first_epoch: int, fingerprint: str, train: dict) -> dict:
    return {"first_row": int(first_row), "first_epoch": int(first_epoch), "data_fingerprint": fingerprint,
            "train_documents": int(train["documents"]), "train_tokens": int(train["tokens"])}


def resumed_segments(state: dict, corpus, sampler_of) -> list[dict] | None:
    """The segments for a run resumed from trainer_state `state` on `corpus`; None when the run's rows need no
    segments (it started on this very corpus and never crossed an append). sampler_of(segment) -> its Sampler
    (for the rows per epoch of the last segment). DataError when the checkpoint's corpus is not this one or one of
    its earlier versions (find_latest refuses that first; this is the trainer's own check)."""
    saved_fp = (state.get("fingerprints") or {}).get("data")
    segments = state.get("data_segments")
    if not segments:
        if saved_fp in (None, corpus.data_fingerprint):
            return None
        if saved_fp not in corpus.earlier_versions:
            raise DataError(f"the checkpoint was saved on corpus data {saved_fp!r}, neither this corpus nor one of "
                            "its earlier versions")
        segments = [_segment(0, 0, saved_fp, corpus.earlier_versions[saved_fp]["splits"]["train"])]
    last = segments[-1]
    if last["data_fingerprint"] == corpus.data_fingerprint:
        return segments if len(segments) > 1 else None
    rows = rows_seen(state) or 0
    n = sampler_of(last).items_per_epoch
    epoch_in = (rows - last["first_row"]) // n  # epochs completed within the last segment, plus the current one
    first_row = last["first_row"] + (epoch_in + 1) * n
    first_epoch = last["first_epoch"] + epoch_in + 1
    return [*segments, _segment(first_row, first_epoch, corpus.data_fingerprint, corpus.meta["splits"]["train"])]


def resume_sampler(state: dict, corpus, mode: str, seq_len: int, seed: int, sampler: Sampler,
                   micro_batch_size: int = 1, doc_mask: bool = False) -> Sampler:
    """`sampler` (over the whole train split) when the run needs no segments, else a SegmentedSampler."""
    train = corpus.train

    def sampler_of(seg: dict) -> Sampler:
        if seg["data_fingerprint"] == corpus.data_fingerprint:
            return sampler
        docs, tokens = seg["train_documents"], seg["train_tokens"]
        if docs > train.n_docs or int(train.doc_starts[docs]) != tokens:
            raise DataError(f"the corpus version of the checkpoint has {docs:,} train documents of {tokens:,} "
                            f"tokens, not a prefix of this corpus's train split")
        mask = None if train.loss_mask is None else train.loss_mask[:tokens]
        return make_sampler(mode, train.tokens[:tokens], train.doc_starts[:docs + 1], seq_len, seed, mask,
                            micro_batch_size, doc_mask)

    segments = resumed_segments(state, corpus, sampler_of)
    if segments is None:
        return sampler
    return SegmentedSampler(segments, [sampler_of(s) for s in segments])


def segments_of(sampler: Sampler, corpus) -> list[dict]:
    """What trainer_state.json records: the sampler's segments, or the one segment of a plain sampler."""
    return sampler.segments if isinstance(sampler, SegmentedSampler) else one_segment(corpus)
