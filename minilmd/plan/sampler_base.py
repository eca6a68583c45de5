"""What every sampler shares (minilmd/plan/samplers.py: packed; bucketing.py: one document per row): the Batch
that crosses to the device, DataError, the seeded order of row positions epoch by epoch, and the Sampler that cuts
the global batch of a step into ranks and micro-batches. The scheme itself is described in samplers.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100

STREAM_PERMUTATION, STREAM_VALIDATION, STREAM_BUCKETS, STREAM_PACKING = 0, 1, 2, 3
"""The streams of seeded_generator, one per draw of the plan: an epoch's row order (EpochOrder), the validation
windows (samplers.py, pairs.py), bucketing's sort ties (bucketing.py), packing's order of documents
(docpacking.py). Numbered here together so that no two draws of one seed share one; never renumbered, since a run
resumed by a later version must draw the very orders it drew before."""


class DataError(ValueError):
    """The corpus cannot feed this configuration (too small for seq_len, batch that ranks cannot split...)."""


@dataclass
class Batch:
    """Rows for one forward pass, as they cross to the device: one uint16 array of ids and, for chat corpora or
    padded rows, one uint8 array of targets. The labels are derived on the device (trainer: to_device)."""

    input_ids: np.ndarray
    """(rows, width) uint16 token ids; PAD (0) past a row's end."""
    targets: np.ndarray | None
    """(rows, width) uint8: 1 where the token is a target, predicted from the position before it (so column 0 never
    is). None: every token but the first of each row (packed text windows without data.doc_mask)."""
    n_targets: int
    """Predictions the loss sums over: targets[:, 1:].sum()."""
    n_real_tokens: int
    """Non-PAD tokens in input_ids (tokens/s counts these)."""
    positions: np.ndarray | None = None
    """(rows, width) int32 rotary position of each token within its document piece, for packed rows with
    `data.doc_mask` (minilmd/plan/docmask.py); None: positions 0..width-1 and plain causal attention."""
    reference: np.ndarray | None = None
    """(rows,) float32: DPO's reference sum of log-probabilities over each row's targets (minilmd/plan/pairs.py);
    None for every other objective."""

    @property
    def labels(self) -> np.ndarray:
        """int64 labels in the model's `forward(ids, labels)` convention (-100 where not a target; for tests)."""
        labels = self.input_ids.astype(np.int64)
        if self.targets is None:
            labels[:, 0] = IGNORE_INDEX
        else:
            labels[self.targets == 0] = IGNORE_INDEX
        return labels


def seeded_generator(seed: int, stream: int, epoch: int) -> np.random.Generator:
    """The generator of one draw of the plan: a pure function of (seed, stream, epoch), so a batch is the same after
    any resume, on any number of ranks (samplers.py's scheme)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, stream, epoch])))


class EpochOrder:
    """The order of n items for each epoch, drawn from (seed, epoch); caches the latest epoch only. Subclasses
    change `draw` (bucketing: minilmd/plan/bucketing.py)."""

    def __init__(self, n_items: int, seed: int, offset_range: int = 0):
        self.n_items = n_items
        self.seed = seed
        self.offset_range = offset_range
        self._cached_epoch: int | None = None
        self._cached: tuple[int, np.ndarray] = (0, np.empty(0, np.int64))

    def draw(self, e: int) -> tuple[int, np.ndarray]:
        rng = seeded_generator(self.seed, STREAM_PERMUTATION, e)
        offset = int(rng.integers(0, self.offset_range)) if self.offset_range > 1 else 0
        return offset, rng.permutation(self.n_items).astype(np.int64)

    def epoch(self, e: int) -> tuple[int, np.ndarray]:
        """(offset, item order) of epoch e."""
        if self._cached_epoch != e:
            self._cached = self.draw(e)
            self._cached_epoch = e
        return self._cached

    def items(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(item index, epoch offset) for each global row position."""
        idx = np.empty(len(positions), np.int64)
        offsets = np.empty(len(positions), np.int64)
        epochs = positions // self.n_items
        for e in np.unique(epochs):
            offset, perm = self.epoch(int(e))
            sel = epochs == e
            idx[sel] = perm[positions[sel] % self.n_items]
            offsets[sel] = offset
        return idx, offsets


class Sampler:
    """Rows of training batches as a pure function of (seed, step); see the module docstring."""

    mode = "?"

    def __init__(self, n_items: int, seq_len: int, seed: int, offset_range: int = 0,
                 order: EpochOrder | None = None):
        if n_items <= 0:
            raise DataError(self._too_small_message(seq_len))
        self.seq_len = seq_len
        self.seed = seed
        self.order = order or EpochOrder(n_items, seed, offset_range)

    @property
    def items_per_epoch(self) -> int:
        """Rows of one epoch: windows (packed) or documents (padded, bucketed)."""
        return self.order.n_items

    def _too_small_message(self, seq_len: int) -> str:  # pragma: no cover - overridden
        return "empty corpus"

    def rows(self, positions: np.ndarray) -> Batch:
        raise NotImplementedError

    def batch(self, step: int, global_batch: int, rank: int = 0, world_size: int = 1,
              micro: int = 0, micro_batch_size: int | None = None, first_row: int | None = None) -> Batch:
        """Rows of one micro-batch of rank `rank` at optimizer step `step` (global batch `global_batch` rows).
        micro_batch_size None: all of the rank's rows. first_row: the global batch's first row position, when it
        is not step * global_batch (a run resumed with a different global batch continues from its rows seen)."""
        if global_batch % world_size:
            raise DataError(f"global batch {global_batch} rows cannot be split evenly over {world_size} ranks")
        per_rank = global_batch // world_size
        mb = per_rank if micro_batch_size is None else micro_batch_size
        if per_rank % mb or not 0 <= micro < per_rank // mb:
            raise DataError(f"micro-batch {micro} of size {mb} does not fit {per_rank} rows per rank")
        row0 = step * global_batch if first_row is None else first_row
        start = row0 + rank * per_rank + micro * mb
        return self.rows(np.arange(start, start + mb, dtype=np.int64))

    def global_counts(self, first_row: int, global_batch: int) -> tuple[int, int]:
        """(predictions, real tokens) of the whole global batch starting at row `first_row`. Every rank computes
        it alone, without a collective, to weight its micro-batch losses."""
        b = self.rows(np.arange(first_row, first_row + global_batch, dtype=np.int64))
        return b.n_targets, b.n_real_tokens
