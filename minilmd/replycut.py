"""What train.seq_len cuts away of a chat corpus's replies, counted one way for SFT and DPO.

A row of one document (plan/bucketing.py DocumentRows: SFT's padded and bucketed rows, padding-free SFT's packed
conversations, each side of a DPO pair) keeps a conversation's first seq_len tokens, so its targets past them are
lost, and a conversation whose replies all lie past them trains nothing. `targets_past` is that count, from the
loss mask; the trainer takes it over every cut document (exact), `run --check` over at most SAMPLE_DOCS of them per
split (`chat_replies_cut`: only the documents longer than seq_len are read, found from doc_lengths.npy, the index;
more than that many are sampled evenly and the counts scaled, and said to be estimates). rowcount.replies_fit is
what a run makes of the count (refused past half the reply tokens, a warning on any)."""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd.bounded import bounded_probe
from minilmd.config import RunConfig, apply_stage_defaults
from minilmd.corpus_meta import data_format_of, meta_value
from minilmd.names import DOC_LENGTHS, LOSS_MASK, SPLITS
from minilmd.rowcount import RepliesCut, kind_of_rows, pairs_fit, replies_fit
from minilmd.untrusted import Unreadable, open_regular
from minilmd.urls import is_url

if TYPE_CHECKING:
    import numpy as np

SAMPLE_DOCS = 4096
"""Documents longer than seq_len whose loss mask `run --check` reads at most per split: at most SAMPLE_DOCS x the
prepared --seq-len bytes (32 MiB at 8192)."""
_MAX_INDEX_BYTES = 1 << 30
"""doc_lengths.npy read whole by `run --check`: 8 bytes a document at most (128 M documents)."""


def targets_past(loss_mask: np.ndarray, doc_starts: np.ndarray, seq_len: int, docs: np.ndarray) -> np.ndarray:
    """Targets of each of `docs` at offsets seq_len and beyond: what its row, the document's first seq_len tokens,
    leaves out."""
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    out = np.zeros(len(docs), np.int64)
    for i, d in enumerate(np.asarray(docs, dtype=np.int64).tolist()):
        start, end = int(doc_starts[d]), int(doc_starts[d + 1])
        out[i] = int(np.asarray(loss_mask[start + seq_len:end]).sum(dtype=np.int64))
    return out


def rows_cut(n_targets: np.ndarray, doc_lengths: np.ndarray, loss_mask: np.ndarray, doc_starts: np.ndarray,
             seq_len: int) -> RepliesCut:
    """The trainer's exact count of a split from its rows (`n_targets`: the targets each row keeps)."""
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    long_docs = np.flatnonzero(np.asarray(doc_lengths) > seq_len)
    lost = int(targets_past(loss_mask, doc_starts, seq_len, long_docs).sum())
    kept = int(np.asarray(n_targets).sum())
    return RepliesCut(int(np.count_nonzero(np.asarray(n_targets) == 0)), int(len(n_targets)), lost, kept + lost)


def chat_replies_cut(split_dir: str | os.PathLike, seq_len: int, targets: int, limit: int = SAMPLE_DOCS) -> RepliesCut:
    """`run --check`'s count of one split of a prepared chat corpus (`targets`: its meta.json's target_tokens): the
    loss mask of its documents longer than seq_len, at most `limit` of them evenly spaced (module docstring).
    Raises OSError when a file cannot be read as one of the corpus's (Unreadable, a bad .npy, a short mask)."""
    try:
        return _count(Path(split_dir), seq_len, targets, limit)
    except Unreadable as e:
        raise OSError(str(e)) from None


def _count(split: Path, seq_len: int, targets: int, limit: int) -> RepliesCut:
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    lengths = _doc_lengths(split / DOC_LENGTHS)
    starts = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    long_docs = np.flatnonzero(lengths > seq_len)
    read = long_docs
    if long_docs.size > limit:
        read = long_docs[np.linspace(0, long_docs.size - 1, limit).astype(np.int64)]
    without = lost = 0
    fd = open_regular(split / LOSS_MASK)
    try:
        for d in read.tolist():
            start, n = int(starts[d]), int(lengths[d])
            mask = np.frombuffer(os.pread(fd, n, start), np.uint8)
            if mask.size != n:
                raise OSError(f"{split / LOSS_MASK}: shorter than {DOC_LENGTHS} says")
            lost += int(mask[seq_len:].sum(dtype=np.int64))
            without += not mask[1:seq_len].any()
    finally:
        os.close(fd)
    scale = long_docs.size / read.size if read.size else 0.0
    return RepliesCut(round(without * scale), int(lengths.size), min(targets, round(lost * scale)), targets,
                      sampled=read.size < long_docs.size)


def _doc_lengths(path: Path) -> np.ndarray:
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    fd = open_regular(path)
    try:
        if os.fstat(fd).st_size > _MAX_INDEX_BYTES:
            raise OSError(f"{path}: larger than {_MAX_INDEX_BYTES} bytes")
        with open(fd, "rb", closefd=False) as f:
            lengths = np.load(f, allow_pickle=False)
    except (ValueError, EOFError) as e:
        raise OSError(f"{path}: not readable ({e})") from None
    finally:
        os.close(fd)
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu":
        raise OSError(f"{path}: not a 1-D integer array")
    return lengths.astype(np.int64, copy=False)


def replies_cut(cfg: RunConfig, meta: dict) -> tuple[str, str]:
    """`run --check`'s (problem, warning) of what train.seq_len cuts away of the replies of the corpus whose
    meta.json is `meta`: a preference corpus's pairs from meta.json (rowcount.pairs_fit), an SFT corpus's
    conversations from its loss mask (chat_replies_cut, rowcount.replies_fit) when its rows are single
    conversations (the run as trained: its stage's defaults applied); ("", "") when nothing is cut or the counts
    cannot be read now (the trainer counts again at its start)."""
    if data_format_of(meta) == "dpo":
        return pairs_fit(meta, cfg.train.seq_len)
    trained = copy.deepcopy(cfg)
    apply_stage_defaults(trained, "chat")
    seq_len = trained.train.seq_len
    if (data_format_of(meta) != "chat" or not cfg.data.prepared or is_url(cfg.data.prepared)
            or kind_of_rows(trained.data.mode, trained.data.doc_mask, True) not in ("padded", "bucketed",
                                                                                   "conversations")):
        return "", ""
    counts = {}
    for split in SPLITS:
        targets = meta_value(meta, "splits", split, "target_tokens")
        if isinstance(targets, int) and targets > 0:
            answered, counts[split], _ = bounded_probe(chat_replies_cut, Path(cfg.data.prepared) / split, seq_len,
                                                       targets)
            if not answered:
                return "", ""
    return replies_fit(counts, seq_len, meta_value(meta, "chat", "seq_len"))
