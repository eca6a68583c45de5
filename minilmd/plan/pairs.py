"""Rows of a preference corpus (`prepare --format dpo`: documents 2i and 2i + 1 of a split are pair i's chosen and
rejected sides, docs/formats.md) for DPO (trainer/loop/objective_dpo.py).

A sampler item is a pair: `train.micro_batch_size` counts pairs, and a micro-batch of n pairs is 2n rows, the
chosen and rejected sides of each pair adjacent (rows 2i, 2i + 1), so that both sides of a pair are always in one
micro-batch. The pairs are length-bucketed exactly as bucketing.py buckets documents (a pair's length: its longer
side's), each micro-batch padded to the width class of its longest row, never to seq_len. A batch counts its pairs
as its targets (the step divides the summed loss by the global batch's pairs) and carries the reference's
per-row log-probability sums (`reference`, set once they are known: trainer/loop/dpo_reference.py).

The validation set: up to data.val_windows pairs of the val split drawn with VAL_SEED, grouped by length.
"""
from __future__ import annotations

import numpy as np

from minilmd.config import ConfigError, RunConfig
from minilmd.corpus.analysis.stats import width_class
from minilmd.plan.bucketing import BucketedSampler, BucketOrder, DocumentRows
from minilmd.plan.sampler_base import STREAM_VALIDATION, Batch, DataError, Sampler, seeded_generator
from minilmd.plan.samplers import VAL_SEED
from minilmd.rowcount import pairs_fit, too_few_rows


class PairRows:
    """The rows of a split's pairs: `lengths[p]` (the longer side's row), batches of pairs with their reference."""

    def __init__(self, tokens: np.ndarray, doc_starts: np.ndarray, seq_len: int, loss_mask: np.ndarray):
        self.docs = DocumentRows(tokens, doc_starts, seq_len, loss_mask)
        if self.docs.n_docs % 2:
            raise DataError(f"a preference split of {self.docs.n_docs} documents: its documents are pairs")
        self.n_pairs = self.docs.n_docs // 2
        self.n_docs = self.n_pairs  # what a sampler counts as its items
        self.lengths = np.maximum(self.docs.lengths[0::2], self.docs.lengths[1::2])
        self.reference: np.ndarray | None = None
        """float32 per document: the reference's log-probability sum over its targets (None until computed)."""

    @staticmethod
    def documents(pairs: np.ndarray) -> np.ndarray:
        """The documents of these pairs, chosen then rejected for each."""
        pairs = np.asarray(pairs, dtype=np.int64)
        return np.stack([2 * pairs, 2 * pairs + 1], axis=1).reshape(-1)

    def batch(self, pairs: np.ndarray, width: int | None = None) -> Batch:
        docs = self.documents(pairs)
        b = self.docs.batch(docs, width)
        b.n_targets = len(pairs)
        if self.reference is not None:
            b.reference = self.reference[docs]
        return b

    def counts(self, pairs: np.ndarray) -> tuple[int, int]:
        """(pairs, real tokens of both sides' rows)."""
        return len(pairs), int(self.docs.lengths[self.documents(pairs)].sum())

    def without_reply(self) -> int:
        """Pairs a side of which keeps no target in its row: its final reply falls wholly past seq_len."""
        targets = self.docs.n_targets
        return int(np.count_nonzero((targets[0::2] == 0) | (targets[1::2] == 0)))


def check_pairs_fit(train: PairRows, val: PairRows, meta: dict, cfg: RunConfig, warn: bool) -> None:
    """The trainer's count of the pairs train.seq_len leaves without a reply token, in its own rows (a corpus from
    before meta.json's `reply_starts` included): ConfigError (exit 2) when rowcount.pairs_fit refuses them, as
    `run --check` does from meta.json; printed as a warning (`warn`: the main rank) when some are."""
    counts = {split: (rows.without_reply(), rows.n_pairs) for split, rows in (("train", train), ("val", val))
              if rows.n_pairs}
    problem, warning = pairs_fit(meta, train.docs.seq_len, counts)
    if problem:
        raise ConfigError([f"data.prepared = {cfg.data.prepared!r}: {problem}"], cfg.source)
    if warning and warn:
        print(f"minilmd train: warning: {warning}", flush=True)


class PairSampler(BucketedSampler):
    """Length-bucketed micro-batches of whole pairs (module docstring)."""

    mode = "pairs"

    def __init__(self, tokens: np.ndarray, doc_starts: np.ndarray, seq_len: int, seed: int, micro_batch_size: int,
                 loss_mask: np.ndarray):
        if micro_batch_size < 1:
            raise DataError(f"DPO needs a micro-batch of at least 1 pair, got {micro_batch_size}")
        rows = PairRows(tokens, doc_starts, seq_len, loss_mask)
        if too_few := too_few_rows("pairs", items=rows.n_pairs, tokens=0, seq_len=seq_len,
                                   micro_batch_size=micro_batch_size, unit="pairs"):
            raise DataError(too_few)  # run --check's refusal too (minilmd/probes.py): one rule
        self.docs = rows  # type: ignore[assignment]  # PairRows: the methods of DocumentRows the sampler calls
        self.pairs = rows
        self.bucket = micro_batch_size
        Sampler.__init__(self, rows.n_pairs, seq_len, seed, order=BucketOrder(rows.lengths, seed, micro_batch_size))

    def _too_small_message(self, seq_len: int) -> str:
        return "the train split has no pairs"


def validation_pairs(rows: PairRows, n_pairs: int, batch_size: int) -> list[Batch]:
    """The fixed validation set (module docstring), in batches of batch_size pairs, each padded to its width class;
    built when `rows.reference` is known (the batches carry it)."""
    if rows.n_pairs == 0:
        raise DataError("the val split has no pairs; DPO's validation needs some (prepare with a larger "
                        "--val-fraction)")
    rng = seeded_generator(VAL_SEED, STREAM_VALIDATION, 0)
    pairs = np.sort(rng.choice(rows.n_pairs, size=min(n_pairs, rows.n_pairs), replace=False))
    pairs = pairs[np.argsort(rows.lengths[pairs], kind="stable")]
    seq_len = rows.docs.seq_len
    return [rows.batch(chunk, width_class(int(rows.lengths[chunk].max()), seq_len))
            for chunk in (pairs[i:i + batch_size] for i in range(0, len(pairs), batch_size))]
