"""Document boundaries of packed windows (`data.doc_mask = true`), found on the host with the batch.

A packed window (samplers.py) holds the tail of one document, whole documents, and the head of another. With
doc_mask the model treats each of those pieces as if it ran alone: a token attends only to earlier tokens of its own
piece (block-causal attention) and its rotary position counts from the piece's first token. All of it follows from
one (rows, width) int32 array, the rotary position of every token (`window_positions`): a piece starts where the
position is 0 (column 0 of every row, and every document start inside the window, taken from the corpus's
doc_lengths, never from the token ids: a chat document holds several `<|im_start|>`, which is also BOS). The
device derives the mask from it (trainer/model/minimind.py: `document_mask`), so the step needs no host sync.

The prediction of a piece's first token from the last token of the piece before it (EOS -> BOS, or a cut) is no
target: alone, no document predicts its own BOS. So a masked row's summed loss is exactly the sum of the losses of
its pieces run one at a time (tests/test_docmask.py). The batch carries that as its `targets` (`piece_targets`), so
the labels are derived on the device as for any chat row.
"""
from __future__ import annotations

import numpy as np


def window_positions(starts: np.ndarray, length: int, doc_starts: np.ndarray) -> np.ndarray:
    """(len(starts), length) int32: for the window of `length` stream tokens starting at each of `starts`, the
    position of each token within its document piece (0 at the window's first token and at every document start
    inside the window). doc_starts: the split's document offsets (TokenStream.doc_starts, with the end)."""
    starts = np.asarray(starts, dtype=np.int64)
    cols = np.arange(length, dtype=np.int64)
    absolute = starts[:, None] + cols[None, :]  # stream offset of every token of every window
    doc = np.searchsorted(doc_starts, absolute, side="right") - 1  # the document each token belongs to
    piece_start = np.maximum(doc_starts[np.clip(doc, 0, len(doc_starts) - 1)], starts[:, None])
    return (absolute - piece_start).astype(np.int32)


def piece_targets(positions: np.ndarray, targets: np.ndarray | None) -> np.ndarray:
    """(rows, width) uint8 targets of masked rows: the tokens that are targets (all, for text) and do not start a
    piece. Carried as the batch's `targets`, so the labels come from them as for any chat row (to_device)."""
    keep = positions != 0
    return (keep if targets is None else keep & (targets != 0)).astype(np.uint8)
