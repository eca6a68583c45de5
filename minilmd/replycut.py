"""What train.seq_len cuts away of a chat corpus's replies, counted one way for SFT and DPO.

A row of one document (plan/bucketing.py DocumentRows: SFT's padded and bucketed rows, padding-free SFT's packed
conversations, each side of a DPO pair) keeps a conversation's first seq_len tokens, so its targets past them are
lost, and a conversation whose replies all lie past them trains nothing. `row_targets` is the one home of that rule
(what a row keeps, what it loses, from the loss mask) and `tally` of what a split makes of it; the trainer takes them
over every document (exact: DocumentRows keeps them), `run --check` over at most SAMPLE_DOCS of the long ones per
split (`chat_replies_cut`: only the documents longer than seq_len are read, found from doc_lengths.npy, the index,
checked first against the mask and meta.json: its dtype the one prepare writes and its header at least the documents
meta.json lists, before any length is read (minilmd/doc_index.py), then only those lengths, streamed in chunks, and the
mask's prefix meta.json describes (an append writes its tail first); more than that many are sampled evenly and the
counts scaled, and said to be estimates; each file it opens is recorded in `seen` with its identity, for
minilmd/reply_check.py's cache). rowcount.replies_fit is what a run makes of the count (refused past half of the train
split's reply tokens, a warning on any)."""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

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
_MAX_ROW = 1 << 24
"""The longest document `run --check` reads in one piece (a corpus prepared at a --seq-len past it is not counted
there: the trainer counts it at its start)."""
COUNT_VERSION = 3
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


def chat_replies_cut(split_dir: str | os.PathLike, seq_len: int, listed: object, prepared_seq_len: int | None,
                     limit: int = SAMPLE_DOCS, seen: Seen | None = None) -> RepliesCut:
    """`run --check`'s count of one split of a prepared chat corpus (`listed`: its meta.json's splits.<split> table,
    documents, tokens and target_tokens; `prepared_seq_len` its chat.seq_len): the loss mask of its documents longer
    than seq_len, at most `limit` of them evenly spaced (module docstring). Raises CorpusLies when the index disagrees
    with the mask or meta.json, OSError when a file cannot be read as one of the corpus's (Unreadable, a bad .npy, a
    mask shorter than the index says: one truncated or being written, too large to read), its words naming the file.
    `seen`: module docstring."""
    try:
        return _count(Path(split_dir), seq_len, listed, prepared_seq_len, limit, {} if seen is None else seen)
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


def _count(split: Path, seq_len: int, listed: object, prepared_seq_len: int | None, limit: int,
           seen: Seen) -> RepliesCut:
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    if prepared_seq_len is not None and prepared_seq_len > _MAX_ROW:
        raise OSError(f"prepared at --seq-len {prepared_seq_len:,}: documents that long are not read here")
    documents, tokens, targets = _listed(listed, split)
    index = _open_counted(split / DOC_LENGTHS, seen)
    try:
        offset = _index_header(index, split / DOC_LENGTHS, documents)
        scan = _scan(index, split, offset, documents, seq_len)
        fd = _open_counted(split / LOSS_MASK, seen)
        try:
            _check_index(scan, tokens, os.fstat(fd).st_size, prepared_seq_len, split)
            read = min(scan.long_docs, limit)
            wanted = np.arange(read) if read == scan.long_docs else np.linspace(0, scan.long_docs - 1, limit)
            kept, lost = _read_long(index, fd, split, offset, documents, seq_len, wanted.astype(np.int64), scan)
        finally:
            os.close(fd)
    finally:
        os.close(index)
    return tally(kept, lost, documents, targets, scan.long_docs / read if read else 1.0)


def _listed(listed: object, split: Path) -> tuple[int, int, int]:
    """(documents, tokens, target_tokens) of the split as its meta.json lists them (`listed`: its splits.<split>
    table), or CorpusLies: the count reads no more of the index and the mask than they describe."""
    got = [listed.get(key) if isinstance(listed, dict) else None for key in ("documents", "tokens", "target_tokens")]
    documents, tokens, targets = (n if type(n) is int and n >= 0 else -1 for n in got)
    if min(documents, tokens, targets) < 0:
        raise CorpusLies(f"its {CORPUS_META} does not give {split.name}'s documents, tokens and target_tokens as "
                         f"counts (prepare it again)")
    return documents, tokens, targets


def _index_header(fd: int, path: Path, documents: int) -> int:
    """doc_index.index_header's offset: its lies a CorpusLies, a truncated index an OSError (not read now)."""
    from minilmd.doc_index import IndexLies, index_header

    try:
        return index_header(fd, path, documents)[0]
    except IndexLies as e:
        raise (OSError(str(e)) if e.truncated else CorpusLies(str(e))) from None


class _Scan(NamedTuple):
    """What one pass over the index found: its shortest and longest document, their sum, the documents longer than
    seq_len."""
    shortest: int
    longest: int
    total: int
    long_docs: int


def _scan(fd: int, split: Path, offset: int, documents: int, seq_len: int) -> _Scan:
    """The index's first `documents` lengths, read doc_index.CHUNK_DOCS at a time (never the whole index widened)."""
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    from minilmd.doc_index import IndexLies, chunks

    shortest, longest, total, long_docs = 0, 0, 0, 0
    try:
        for i, chunk in enumerate(chunks(fd, split / DOC_LENGTHS, offset, documents)):
            low, high = int(chunk.min()), int(chunk.max())
            shortest, longest = (low, high) if i == 0 else (min(shortest, low), max(longest, high))
            total += int(chunk.sum(dtype=np.int64))
            long_docs += int(np.count_nonzero(chunk > seq_len))
    except IndexLies as e:  # it shrank since its header was read
        raise OSError(str(e)) from None
    return _Scan(shortest, longest, total, long_docs)


def _read_long(index: int, fd: int, split: Path, offset: int, documents: int, seq_len: int, wanted: np.ndarray,
               scan: _Scan) -> tuple[np.ndarray, np.ndarray]:
    """row_targets of the documents longer than seq_len whose ranks among them are `wanted` (ascending), their mask
    read from `fd` one document at a time, found by a second pass over the index."""
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    from minilmd.doc_index import IndexLies, chunks

    kept, lost = np.zeros(wanted.size, np.int64), np.zeros(wanted.size, np.int64)
    done, rank, at = 0, 0, 0  # wanted ones counted, long documents passed, the chunk's first token
    try:
        for chunk in chunks(index, split / DOC_LENGTHS, offset, documents) if wanted.size else ():
            long_here = np.flatnonzero(chunk > seq_len)
            upto = int(np.searchsorted(wanted, rank + long_here.size))
            picked = long_here[wanted[done:upto] - rank]
            ends = np.cumsum(chunk, dtype=np.int64)  # the chunk's one widened array
            starts = (at + ends[picked] - chunk[picked]).tolist()
            for i, (start, n) in enumerate(zip(starts, chunk[picked].tolist(), strict=True)):
                if not seq_len < n <= scan.longest:  # rewritten since the first pass: a length it did not check
                    raise OSError(f"{split / DOC_LENGTHS}: changed while it was read")
                kept[done + i], lost[done + i] = _row_of(fd, split, start, n, seq_len)
            done, rank, at = upto, rank + long_here.size, at + int(ends[-1])
    except IndexLies as e:
        raise OSError(str(e)) from None
    return kept, lost


def _row_of(fd: int, split: Path, start: int, n: int, seq_len: int) -> tuple[int, int]:
    """row_targets of the document of `n` tokens at `start` of the mask open at `fd`."""
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    try:
        mask = np.frombuffer(os.pread(fd, n, start), np.uint8)
    except OSError as e:  # EIO: name the file, which pread's error does not
        raise OSError(f"{split / LOSS_MASK}: {e.strerror or e}") from None
    if mask.size != n:
        raise OSError(f"{split / LOSS_MASK}: shorter than {DOC_LENGTHS} says")
    (kept,), (lost,) = row_targets(mask, np.array([0, n]), seq_len)
    return int(kept), int(lost)


def _check_index(scan: _Scan, tokens: int, mask_bytes: int, prepared_seq_len: int | None, split: Path) -> None:
    """The index agrees with the mask and meta.json, or CorpusLies: no length below 0 or past the --seq-len the
    corpus was prepared at (prepare cut or dropped longer ones), the sum of the lengths meta.json counts its tokens,
    and the mask at least that long (a byte a token; longer: an append's tail, written before meta.json). A corpus
    with a document past _MAX_ROW, or a mask shorter than the sum (truncated, or being written: not read now, as an
    unreadable one): OSError (not read here)."""
    if scan.shortest < 0:
        raise CorpusLies(f"{split / DOC_LENGTHS} gives a document {scan.shortest:,} tokens long")
    if prepared_seq_len is not None and scan.longest > prepared_seq_len:
        raise CorpusLies(f"{split / DOC_LENGTHS} gives a document {scan.longest:,} tokens long, longer than the "
                         f"--seq-len {prepared_seq_len:,} its {CORPUS_META} says it was prepared at")
    if scan.longest > _MAX_ROW:
        raise OSError(f"{split / DOC_LENGTHS}: a document of {scan.longest:,} tokens is not read here")
    if scan.total != tokens:
        raise CorpusLies(f"{split / DOC_LENGTHS} counts {scan.total:,} tokens in the {split.name} documents its "
                         f"{CORPUS_META} lists, which gives {tokens:,}")
    if tokens > mask_bytes:  # a file cut short (a copy not finished, one rewritten now) is not read, not a lie
        raise OSError(f"{split / LOSS_MASK}: {mask_bytes:,} bytes, shorter than the {tokens:,} tokens {DOC_LENGTHS} "
                      f"counts (truncated, or being written)")


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
        counts = {split: chat_replies_cut(Path(cfg.data.prepared) / split, seq_len,
                                          meta_value(meta, "splits", split), at, seen=seen)
                  for split in SPLITS
                  if isinstance(targets := meta_value(meta, "splits", split, "target_tokens"), int) and targets > 0}
    except CorpusLies as e:
        return f"{e}: not a corpus the trainer can read", ""
    return replies_fit(counts, seq_len, at)
