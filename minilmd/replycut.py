"""What train.seq_len cuts away of a chat corpus's replies, counted one way for SFT and DPO.

A row of one document (plan/bucketing.py DocumentRows: SFT's padded and bucketed rows, padding-free SFT's packed
conversations, each side of a DPO pair) keeps a conversation's first seq_len tokens, so its targets past them are
lost, and a conversation whose replies all lie past them trains nothing. `row_targets` is the one home of that rule
(what a row keeps, what it loses, from the loss mask) and `tally` of what a split makes of it; the trainer takes them
over every document (exact: DocumentRows keeps them), `run --check` over at most SAMPLE_DOCS of the long ones per
split (`chat_replies_cut`: only the documents longer than seq_len are read, found from doc_lengths.npy, the index,
checked first against the mask and meta.json; more than that many are sampled evenly and the counts scaled, and said
to be estimates; each file it opens is recorded in `seen` with its identity, for minilmd/reply_check.py's cache).
rowcount.replies_fit is what a run makes of the count (refused past half of the train split's reply tokens, a warning
on any)."""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd.config import RunConfig, apply_stage_defaults
from minilmd.corpus_meta import data_format_of, meta_value
from minilmd.names import CORPUS_META, DOC_LENGTHS, LOSS_MASK, SPLITS
from minilmd.rowcount import RepliesCut, kind_of_rows, pairs_fit, replies_fit
from minilmd.untrusted import Unreadable, open_regular
from minilmd.urls import is_url

if TYPE_CHECKING:
    import numpy as np

SAMPLE_DOCS = 4096
"""Documents longer than seq_len whose loss mask `run --check` reads at most per split: at most SAMPLE_DOCS x the
prepared --seq-len bytes (32 MiB at 8192), one document at a time."""
_MAX_INDEX_BYTES = 1 << 30
"""doc_lengths.npy read whole by `run --check`: 8 bytes a document at most (128 M documents)."""
_MAX_ROW = 1 << 24
"""The longest document `run --check` reads in one piece (a corpus prepared at a --seq-len past it is not counted
there: the trainer counts it at its start)."""
COUNT_VERSION = 2
"""The version of `run --check`'s count: part of reply_check's cache key, so that a count kept from an older rule is
never reused. Raise it whenever what the count reads or how it counts changes."""

Seen = dict[str, "tuple[int, ...] | None"]
"""{path: its identity (file_identity) when the count opened it, None before (or when it could not be opened)}: the
files a count read, filled as it goes (a count that does not answer in time leaves what it had opened so far)."""


def file_identity(st: os.stat_result) -> tuple[int, ...]:
    """What tells a file rewritten from the one read before: device and inode (replaced by a rename), size and
    mtime (rewritten in place), ctime too, which no one can set back (os.utime sets mtime, and moves ctime)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode


class CorpusLies(ValueError):
    """A prepared chat corpus whose files disagree (meta.json, doc_lengths.npy, loss_mask.bin): the words say which;
    refused, not counted."""


def prepared_at(meta: object) -> int | None:
    """The --seq-len a chat corpus was prepared at (its meta.json's chat.seq_len: no document is longer); None when
    meta.json does not say it (a corpus built by hand). Raises CorpusLies when it says it malformed: a `chat` that is
    not a table, a seq_len that is not a positive integer."""
    chat = meta_value(meta, "chat")
    value = chat.get("seq_len") if isinstance(chat, dict) else chat
    if value is None:
        return None
    if not isinstance(chat, dict) or type(value) is not int or value < 1:
        said = f"chat = {chat!r}" if not isinstance(chat, dict) else f"chat.seq_len = {value!r}"
        raise CorpusLies(f"its {CORPUS_META} gives {said[:80]}, not the positive --seq-len of a chat corpus "
                         f"`minilmd prepare` wrote (prepare it again)")
    return value


def row_targets(loss_mask: np.ndarray, doc_starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(targets each document's row keeps, targets past it). A row is the document's first seq_len tokens and its
    targets the loss mask at offsets 1..seq_len-1 (nothing predicts offset 0); offsets seq_len and beyond are what
    seq_len cuts away. Vectorised: one reduceat over the documents, one over the cut ones' tails."""
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    doc_starts = np.asarray(doc_starts, dtype=np.int64)
    n = max(len(doc_starts) - 1, 0)
    kept, lost = np.zeros(n, np.int64), np.zeros(n, np.int64)
    if not n:
        return kept, lost
    mask = loss_mask[:int(doc_starts[-1])]
    starts, lengths = doc_starts[:-1], np.diff(doc_starts)
    # a 32-bit sum is exact below 2**32 tokens a document, and several times faster than numpy's cast to 64 bits
    wide = np.uint32 if not lengths.size or int(lengths.max()) < 2 ** 32 else np.int64
    filled = np.flatnonzero(lengths > 0)  # reduceat gives an element, not 0, for an empty range
    if filled.size:
        kept[filled] = np.add.reduceat(mask, starts[filled], dtype=wide)
        kept[filled] -= np.asarray(mask[starts[filled]], dtype=np.int64)
    cut = np.flatnonzero(lengths > seq_len)
    if cut.size:  # [cut point, end) of each cut document: strictly increasing bounds
        bounds = np.stack([starts[cut] + seq_len, doc_starts[cut + 1]], 1).ravel()
        lost[cut] = np.add.reduceat(mask, bounds[:-1] if bounds[-1] == mask.size else bounds, dtype=wide)[::2]
    return kept - lost, lost


def tally(kept: np.ndarray, lost: np.ndarray, items: int, targets: int, scale: float = 1.0) -> RepliesCut:
    """One split's RepliesCut from its documents longer than seq_len (row_targets' `kept` and `lost` of them: every
    one, or an even sample whose counts `scale` scales up): those whose row keeps no target, the targets lost, of
    `items` conversations and `targets` targets."""
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    without = int(np.count_nonzero(np.asarray(kept) == 0))
    return RepliesCut(round(without * scale), items, min(targets, round(int(np.sum(lost)) * scale)), targets,
                      sampled=scale != 1.0)


def chat_replies_cut(split_dir: str | os.PathLike, seq_len: int, targets: int, prepared_seq_len: int | None,
                     limit: int = SAMPLE_DOCS, seen: Seen | None = None) -> RepliesCut:
    """`run --check`'s count of one split of a prepared chat corpus (`targets`: its meta.json's target_tokens,
    `prepared_seq_len` its chat.seq_len): the loss mask of its documents longer than seq_len, at most `limit` of them
    evenly spaced (module docstring). Raises CorpusLies when the index disagrees with the mask or meta.json, OSError
    when a file cannot be read as one of the corpus's (Unreadable, a bad .npy, a mask shorter than the index says: one
    truncated or being written, too large to read), its words naming the file. `seen`: module docstring."""
    try:
        return _count(Path(split_dir), seq_len, targets, prepared_seq_len, limit, {} if seen is None else seen)
    except Unreadable as e:
        raise OSError(str(e)) from None
    except MemoryError:
        raise OSError(f"{split_dir}: not enough memory to count its replies") from None


def _open_counted(path: Path, seen: Seen) -> int:
    """open_regular, the file recorded in `seen` (module docstring)."""
    seen[str(path)] = None
    fd = open_regular(path)
    seen[str(path)] = file_identity(os.fstat(fd))
    return fd


def _count(split: Path, seq_len: int, targets: int, prepared_seq_len: int | None, limit: int,
           seen: Seen) -> RepliesCut:
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    if prepared_seq_len is not None and prepared_seq_len > _MAX_ROW:
        raise OSError(f"prepared at --seq-len {prepared_seq_len:,}: documents that long are not read here")
    lengths = _doc_lengths(split / DOC_LENGTHS, seen)
    fd = _open_counted(split / LOSS_MASK, seen)
    try:
        _check_index(lengths, os.fstat(fd).st_size, prepared_seq_len, split)
        starts = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths, out=starts[1:])
        long_docs = np.flatnonzero(lengths > seq_len)
        read = long_docs
        if long_docs.size > limit:
            read = long_docs[np.linspace(0, long_docs.size - 1, limit).astype(np.int64)]
        kept, lost = np.zeros(read.size, np.int64), np.zeros(read.size, np.int64)
        for i, d in enumerate(read.tolist()):
            n = int(lengths[d])  # at most prepared_seq_len and _MAX_ROW: _check_index
            try:
                mask = np.frombuffer(os.pread(fd, n, int(starts[d])), np.uint8)
            except OSError as e:  # EIO: name the file, which pread's error does not
                raise OSError(f"{split / LOSS_MASK}: {e.strerror or e}") from None
            if mask.size != n:
                raise OSError(f"{split / LOSS_MASK}: shorter than {DOC_LENGTHS} says")
            (kept[i],), (lost[i],) = row_targets(mask, np.array([0, n]), seq_len)
    finally:
        os.close(fd)
    return tally(kept, lost, int(lengths.size), targets, long_docs.size / read.size if read.size else 1.0)


def _check_index(lengths: np.ndarray, mask_bytes: int, prepared_seq_len: int | None, split: Path) -> None:
    """The index agrees with the mask and meta.json, or CorpusLies: no length below 0 or past the --seq-len the
    corpus was prepared at (prepare cut or dropped longer ones), and their sum the mask's size (a byte a token). A
    corpus that does not say its --seq-len, with a document past _MAX_ROW, or a mask shorter than the sum (truncated,
    or being written: not read now, as an unreadable one): OSError (not read here)."""
    longest = int(lengths.max()) if lengths.size else 0
    if lengths.size and int(lengths.min()) < 0:
        raise CorpusLies(f"{split / DOC_LENGTHS} gives a document {int(lengths.min()):,} tokens long")
    if prepared_seq_len is not None and longest > prepared_seq_len:
        raise CorpusLies(f"{split / DOC_LENGTHS} gives a document {longest:,} tokens long, longer than the --seq-len "
                         f"{prepared_seq_len:,} its {CORPUS_META} says it was prepared at")
    if longest > _MAX_ROW:
        raise OSError(f"{split / DOC_LENGTHS}: a document of {longest:,} tokens is not read here")
    total = int(lengths.sum())
    if total > mask_bytes:  # a file cut short (a copy not finished, one rewritten now) is not read, not a lie
        raise OSError(f"{split / LOSS_MASK}: {mask_bytes:,} bytes, shorter than the {total:,} tokens {DOC_LENGTHS} "
                      f"counts (truncated, or being written)")
    if total != mask_bytes:
        raise CorpusLies(f"{split / DOC_LENGTHS} counts {total:,} tokens but {split / LOSS_MASK} holds "
                         f"{mask_bytes:,}")


def _doc_lengths(path: Path, seen: Seen) -> np.ndarray:
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    fd = _open_counted(path, seen)
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


def replies_cut(cfg: RunConfig, meta: dict, seen: Seen | None = None) -> tuple[str, str]:
    """`run --check`'s (problem, warning) of what train.seq_len cuts away of the replies of the corpus whose
    meta.json is `meta`: a preference corpus's pairs from meta.json (rowcount.pairs_fit), an SFT corpus's
    conversations from its loss mask (chat_replies_cut, rowcount.replies_fit) when its rows are single
    conversations (the run as trained: its stage's defaults applied); a problem too when the corpus's files disagree
    (CorpusLies). Raises OSError when a file cannot be read now (the trainer counts again at its start). Unbounded:
    its callers bound it (minilmd/reply_check.py). `seen`: the files read (module docstring)."""
    if data_format_of(meta) == "dpo":
        return pairs_fit(meta, cfg.train.seq_len)
    trained = copy.deepcopy(cfg)
    apply_stage_defaults(trained, "chat")
    seq_len = trained.train.seq_len
    if (data_format_of(meta) != "chat" or not cfg.data.prepared or is_url(cfg.data.prepared)
            or kind_of_rows(trained.data.mode, trained.data.doc_mask, True) not in ("padded", "bucketed",
                                                                                   "conversations")):
        return "", ""
    try:
        at = prepared_at(meta)
        counts = {split: chat_replies_cut(Path(cfg.data.prepared) / split, seq_len, targets, at, seen=seen)
                  for split in SPLITS
                  if isinstance(targets := meta_value(meta, "splits", split, "target_tokens"), int) and targets > 0}
    except CorpusLies as e:
        return f"{e}: not a corpus the trainer can read", ""
    return replies_fit(counts, seq_len, at)
