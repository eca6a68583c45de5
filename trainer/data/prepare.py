"""`minilmd prepare`: JSONL corpora -> a prepared corpus of packed uint16 token streams (format: minilmd/corpus.py).

The pipeline streams: the main process reads blocks of whole lines and hands them to worker processes, which
parse, split, and encode them (each with a single-threaded tokenizer, so the cores work in parallel with no
thread pool overhead) and send back uint16 arrays; the main process writes them in input order, so the output does
not depend on the number of workers. At most a few blocks are in flight: memory stays bounded by the block size,
not the corpus size. Everything is written into a temporary directory beside DIR and published at the end (every
file fsynced, then one rename): an interrupted or failed prepare leaves nothing under DIR.

Split: a document goes to val when the first 8 bytes of blake2b(text) read as an integer are below val_fraction *
2**64. The split of a document therefore depends on its text alone (stable when lines are appended), and exact
duplicates always share a split. Leak check: a val document whose text equals a train document's text once all
whitespace is removed is reported and removed from val. Only val keys are held in memory (train keys go through a
temporary file), so the check stays bounded too.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import sys
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minilmd.corpus import FORMAT, VERSION, CorpusError, open_prepared
from minilmd.fsio import atomic_write_json, publish_dir, sha256_file
from minilmd.names import CORPUS_META as META
from minilmd.names import (
    CORPUS_TOKENIZER,
    DOC_LENGTHS,
    LEAK_KEYS,
    LONG_DOCUMENT_SPOOL,
    SPLITS,
    TOKENS,
    UNCHECKED_VAL_TOKENS,
    prepare_aside_name,
    prepare_tmp_name,
    prepare_tmp_owner_pid,
    split_file,
)
from minilmd.protocol import BOS_ID, EOS_ID, PAD_ID
from minilmd.tokenizer import load_tokenizer
from minilmd.trainer.data import corpus_stats
from minilmd.trainer.data.jsonl import BAD_LINE_POLICIES, BadLine, InputError, LongLine, Source, parse_block
from minilmd.trainer.data.longdoc import RESTART, LineVerdict, LongLineParser, PieceCutter, split_pieces

BLOCK_BYTES = 1 << 20
MAX_EXAMPLES = 20  # bad lines and leaks listed by name in meta.json; all of them are counted
NO_DIGEST = 2**64  # above every split digest


def _digest64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def split_is_val(text: str, val_fraction: float) -> bool:
    return _digest64(text.encode("utf-8")) < int(val_fraction * 2**64)


def leak_key(text: str) -> int:
    """Texts equal once all whitespace is removed share a key."""
    return _digest64("".join(text.split()).encode("utf-8"))


def _leak_key_given(text: str, digest: int) -> int:
    """leak_key(text), reusing the text's own digest when it has no whitespace (most Chinese documents)."""
    squeezed = "".join(text.split())
    return digest if len(squeezed) == len(text) else _digest64(squeezed.encode("utf-8"))


@dataclass
class EncodedBlock:
    """What a worker sends back for one block: tokens and per-document facts for each split."""
    n_lines: int
    blank: int
    bad: list
    text_bytes: int
    special_inside: list  # line numbers of documents whose text encodes to a PAD/BOS/EOS id inside
    train_tokens: np.ndarray
    train_lengths: np.ndarray
    train_keys: np.ndarray
    val_tokens: np.ndarray
    val_lengths: np.ndarray
    val_keys: np.ndarray
    val_lines: np.ndarray
    train_min_digest: int  # the smallest split digest of the block's train documents (2**64 when none)


class BlockEncoder:
    """Parse, split and encode one block of lines. Lives in each worker process (or inline with workers=0)."""

    def __init__(self, tokenizer_json: str, val_fraction: float):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_str(tokenizer_json)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.threshold = int(val_fraction * 2**64)
        # encode_batch_fast skips offset tracking, which prepare does not need; same ids as encode_batch.
        self.encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)

    def __call__(self, blob: bytes, first_line: int) -> EncodedBlock:
        parsed = parse_block(blob, first_line)
        texts = parsed.texts
        utf8 = [t.encode("utf-8") for t in texts]
        digests = [_digest64(b) for b in utf8]
        is_val = np.fromiter((d < self.threshold for d in digests), dtype=bool, count=len(texts))
        keys = np.fromiter(map(_leak_key_given, texts, digests), dtype=np.uint64, count=len(texts))
        body, body_lengths = self._encode_texts(texts)
        special_inside = []
        special = body <= max(PAD_ID, BOS_ID, EOS_ID)
        if special.any():
            doc_of_token = np.repeat(np.arange(len(texts)), body_lengths)
            special_inside = [parsed.lines[d] for d in np.unique(doc_of_token[special])]
        lengths = body_lengths + 2
        ends = np.cumsum(lengths)
        tokens = np.empty(int(ends[-1]) if len(ends) else 0, dtype="<u2")
        is_body = np.ones(tokens.size, dtype=bool)
        is_body[ends - lengths] = False
        is_body[ends - 1] = False
        tokens[ends - lengths] = BOS_ID
        tokens[ends - 1] = EOS_ID
        tokens[is_body] = body
        token_is_val = np.repeat(is_val, lengths)
        lines = np.asarray(parsed.lines, dtype=np.int64)
        train_min = min((d for d, v in zip(digests, is_val, strict=True) if not v), default=NO_DIGEST)
        return EncodedBlock(
            n_lines=parsed.n_lines, blank=parsed.blank, bad=parsed.bad, text_bytes=sum(map(len, utf8)),
            special_inside=special_inside,
            train_tokens=tokens[~token_is_val], train_lengths=lengths[~is_val].astype(np.int32),
            train_keys=keys[~is_val],
            val_tokens=tokens[token_is_val], val_lengths=lengths[is_val].astype(np.int32), val_keys=keys[is_val],
            val_lines=lines[is_val], train_min_digest=train_min,
        )


    def _encode_texts(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(the texts' ids one after the other, each text's number of ids). A text longer than PIECE_CHARS is
        encoded in the pieces longdoc.split_pieces cuts, exactly as when it is streamed as a long line."""
        pieces = [split_pieces(t) for t in texts]
        flat = [piece for text_pieces in pieces for piece in text_pieces]
        encs = self.encode(flat, add_special_tokens=False)
        lengths = np.fromiter((len(e) for e in encs), dtype=np.int64, count=len(encs))
        body = np.fromiter(itertools.chain.from_iterable(e.ids for e in encs), dtype=np.uint16,
                           count=int(lengths.sum()))
        self._check_ids(body)
        if len(flat) == len(texts):
            return body, lengths
        firsts = np.cumsum([0] + [len(text_pieces) for text_pieces in pieces[:-1]])
        return body, np.add.reduceat(lengths, firsts)

    def _check_ids(self, body: np.ndarray) -> None:
        if body.size and int(body.max()) >= self.vocab_size:
            raise CorpusError(f"tokenizer produced id {int(body.max())} >= its vocabulary {self.vocab_size}")

    def encode_piece(self, text: str) -> tuple[np.ndarray, bool]:
        """One piece of a long document: (its ids, whether one of them is PAD/BOS/EOS)."""
        enc = self.encode([text], add_special_tokens=False)[0]
        body = np.asarray(enc.ids, dtype=np.uint16)
        self._check_ids(body)
        return body, bool((body <= max(PAD_ID, BOS_ID, EOS_ID)).any())


_worker_encoder: BlockEncoder | None = None


def _worker_init(tokenizer_json: str, val_fraction: float, parent: int) -> None:
    import signal

    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and cleans up
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the workers are the parallelism
    global _worker_encoder
    _worker_encoder = BlockEncoder(tokenizer_json, val_fraction)


def _die_with_parent(parent: int) -> None:
    """Make the kernel SIGKILL this worker when prepare's process ends, however it ends: a prepare killed with
    SIGKILL has no chance to stop its pool, and its workers would go on (and keep multiprocessing's resource tracker
    alive, which ends by itself once no process holds its pipe). PR_SET_PDEATHSIG is Linux's; if the parent already
    ended before the call, exit at once. Elsewhere a no-op."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def _worker_call(method: str, *args):
    """In a pool process: BlockEncoder.<method>(*args) of the worker's encoder ("__call__": a block of lines)."""
    assert _worker_encoder is not None  # set by _worker_init in every pool process
    return getattr(_worker_encoder, method)(*args)


class _InlineExecutor:
    """workers=0: the same code path in this process (tests, tiny inputs)."""

    def __init__(self, tokenizer_json: str, val_fraction: float):
        self.encoder = BlockEncoder(tokenizer_json, val_fraction)

    def submit(self, fn, method: str, *args) -> Future:
        return _done(getattr(self.encoder, method)(*args))

    def shutdown(self, wait=True, cancel_futures=False) -> None:
        pass


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Progress:
    """A bar with bytes/s and ETA on a terminal; a plain line every `interval` seconds otherwise (stderr)."""

    def __init__(self, total_bytes: int, stream=None, tty: bool | None = None, interval: float = 10.0):
        self.total = total_bytes
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = 0.2 if self.tty else interval
        self.start = self.last = time.monotonic()

    def update(self, done_bytes: int, tokens: int, docs: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        rate = done_bytes / elapsed
        frac = done_bytes / self.total if self.total else 0.0
        eta = (self.total - done_bytes) / rate if rate > 0 and self.total else float("nan")
        eta_s = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta == eta else "?"
        text = (f"{frac:6.1%} {done_bytes / 1e6:,.1f}/{self.total / 1e6:,.1f} MB {rate / 1e6:.2f} MB/s "
                f"ETA {eta_s}  {docs:,} docs {tokens:,} tokens ({tokens / elapsed:,.0f} tok/s)")
        if self.tty:
            width = 24
            filled = int(width * min(frac, 1.0))
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}\x1b[K")
        else:
            self.stream.write(f"prepare: {text}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class _SplitWriter:
    """tokens.bin (hashed as written) and the document lengths of one split."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "wb")
        self.sha = hashlib.sha256()
        self.lengths: list[np.ndarray] = []
        self.tokens = 0

    def write(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        data = tokens.data.cast("B") if tokens.size else b""
        self.file.write(data)
        self.sha.update(data)
        self.lengths.append(lengths)
        self.tokens += int(tokens.size)

    def write_spooled(self, spool: _Spool) -> None:
        """One long document: BOS, its ids from the spool (copied in bounded chunks), EOS."""
        self.write(np.array([BOS_ID], dtype="<u2"), np.array([spool.ids + 2], dtype=np.int32))
        for data in spool.read():
            self.file.write(data)
            self.sha.update(data)
        self.write(np.array([EOS_ID], dtype="<u2"), np.zeros(0, dtype=np.int32))
        self.tokens += spool.ids

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()

    def all_lengths(self) -> np.ndarray:
        return np.concatenate(self.lengths) if self.lengths else np.zeros(0, dtype=np.int32)


class _Spool:
    """The ids of the long document being read, in a file beside the output: its split is known only at its end
    (a hash of its whole text), and it may still turn out to be a bad line."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "w+b")
        self.ids = 0
        self.special = False  # an id of PAD/BOS/EOS inside

    def add(self, ids: np.ndarray, special: bool) -> None:
        self.file.write(ids.astype("<u2", copy=False).tobytes())
        self.ids += int(ids.size)
        self.special |= special

    def reset(self) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.ids, self.special = 0, False

    def read(self, chunk: int = 8 << 20):
        self.file.flush()
        self.file.seek(0)
        while data := self.file.read(chunk):
            yield data

    def close(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


@dataclass
class LongEnd:
    """The end of a long line, as the main process saw it stream by: its verdict, and for a document the split
    hash and leak key of its whole text."""
    line: int
    verdict: LineVerdict
    digest: int
    leak_key: int
    text_bytes: int


def _remove_stale_tmp(out: Path) -> None:
    """Temp dirs of prepares that were killed (SIGKILL leaves no chance to clean up)."""
    import psutil

    for p in out.parent.iterdir():
        pid = prepare_tmp_owner_pid(out.name, p.name)
        if pid is not None and not psutil.pid_exists(pid):
            shutil.rmtree(p, ignore_errors=True)


@dataclass
class PrepareOptions:
    """How `prepare` splits, checks and reports; each field is the `minilmd prepare` flag of the same name."""

    val_fraction: float = 0.005
    """Share of documents for validation, by the hash rule of the module docstring; in [0, 1)."""
    on_bad_line: str = "error"
    """"error": stop at the first bad line and write nothing; "skip": count it, keep a few examples, go on."""
    seq_len: int = 340
    """Sequence length of the padding/packing report (the output does not depend on it)."""
    batch_size: int = 32
    """Batch size of the steps-per-epoch report."""
    workers: int | None = None
    """Encoding processes; None: one per core, 0: in this process."""
    block_bytes: int = BLOCK_BYTES
    """Input bytes per work item; a few blocks per worker are in flight, so memory is bounded by this."""

    def problems(self) -> list[str]:
        """Every invalid option at once, each naming its flag."""
        found = []
        if self.on_bad_line not in BAD_LINE_POLICIES:
            found.append(f"--on-bad-line {self.on_bad_line!r}: choose one of {', '.join(BAD_LINE_POLICIES)}")
        if not 0 <= self.val_fraction < 1:
            found.append(f"--val-fraction {self.val_fraction}: must be in [0, 1)")
        if self.seq_len < 2 or self.batch_size < 1:
            found.append(f"--seq-len {self.seq_len} / --batch-size {self.batch_size}: need seq_len >= 2, "
                         f"batch_size >= 1")
        return found


@dataclass
class _Tokenizer:
    """The tokenizer, checked by load_tokenizer, with the JSON text the workers build theirs from."""

    path: Path
    json: str
    vocab_size: int

    @classmethod
    def load(cls, tokenizer: str | Path) -> _Tokenizer:
        path = Path(tokenizer)
        if path.is_dir():
            path = path / CORPUS_TOKENIZER
        tok = load_tokenizer(path)
        return cls(path, path.read_text(encoding="utf-8"), tok.get_vocab_size(with_added_tokens=True))


def prepare(sources: list[str], tokenizer: str | Path, out: str | Path, *, val_fraction: float = 0.005,
            on_bad_line: str = "error", seq_len: int = 340, batch_size: int = 32, workers: int | None = None,
            block_bytes: int = BLOCK_BYTES, force: bool = False, progress: Progress | bool | None = None,
            log=None) -> dict:
    """Prepare `sources` into `out`; returns meta.json's content. Raises InputError (bad input) or ValueError."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    opts = PrepareOptions(val_fraction, on_bad_line, seq_len, batch_size, workers, block_bytes)
    problems = opts.problems() + ([] if sources else ["no corpus files given"])
    if problems:
        raise ValueError("; ".join(problems))
    out = Path(out)
    if out.exists() or out.is_symlink():
        if not force:
            raise ValueError(f"{out} already exists; pass --force to replace it")
        _check_replaceable(out)
    tok = _Tokenizer.load(tokenizer)
    if opts.workers is None:
        opts.workers = default_workers()

    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(out)
    tmp = out.parent / prepare_tmp_name(out.name, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        meta = _prepare_into(tmp, sources, tok, opts, progress, log)
        open_prepared(tmp)  # the invariants, checked by the same code the trainer runs
        if out.exists() or out.is_symlink():
            _check_replaceable(out)  # again: something may have been put there meanwhile
        publish_dir(tmp, out, aside=out.parent / prepare_aside_name(out.name, os.getpid()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


CORPUS_ENTRIES = {META, CORPUS_TOKENIZER, *SPLITS}
"""What a prepared corpus holds at its top; each split directory holds SPLIT_FILES."""
SPLIT_FILES = {TOKENS, DOC_LENGTHS}


def _check_replaceable(out: Path) -> None:
    """ValueError unless `--force` may replace `out`: an empty directory, or a prepared corpus holding nothing but
    its own files. Anything else may be somebody's work (a thesis.txt): replacing it would delete it."""
    what = _foreign_content(out)
    if what:
        raise ValueError(f"{out}: --force replaces only a prepared corpus or an empty directory, and this is {what}; "
                         "nothing was changed. Choose another --out, or move it away yourself")


def _foreign_content(out: Path) -> str:
    """Why out is not replaceable ("" when it is)."""
    if out.is_symlink():
        return f"a symbolic link (to {os.readlink(out)})"
    if not out.is_dir():
        return "not a directory"
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return ""
    try:
        meta = json.loads((out / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return f"not a prepared corpus (no {META} of format {FORMAT!r}; it holds {_listing(entries)})"
    foreign = [name for name in entries if name not in CORPUS_ENTRIES]
    for split in SPLITS:
        if (out / split).is_dir():
            foreign += [f"{split}/{p.name}" for p in sorted((out / split).iterdir()) if p.name not in SPLIT_FILES]
        elif (out / split).exists():
            foreign.append(split)
    if foreign:
        return f"a prepared corpus with other files in it: {_listing(foreign)}"
    return ""


def _listing(names: list[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _prepare_into(tmp: Path, sources: list[str], tok: _Tokenizer, opts: PrepareOptions,
                  progress: Progress | bool | None, log) -> dict:
    """The whole pipeline into the temporary directory `tmp`: encode, leak check, splits, meta.json."""
    for split in SPLITS:
        (tmp / split).mkdir(parents=True)
    shutil.copyfile(tok.path, tmp / CORPUS_TOKENIZER)
    opened = _open_sources(sources)
    found = _Collector(tmp, opened, opts.on_bad_line)
    _encode_all(opened, found, tok, opts, progress)
    if found.documents == 0:
        raise InputError(f"{', '.join(sources)}: no documents (every line was blank or bad)")
    leaked, leak_examples = _leak_check(tmp, found, opened)
    _check_splits(found, leaked, opts.val_fraction)
    train_lengths, val_lengths = _write_splits(tmp, found, leaked)
    meta = _meta(tmp, tok, opts, found, train_lengths, val_lengths, leaked, leak_examples)
    atomic_write_json(tmp / META, meta)
    os.chmod(tmp / META, 0o644)  # atomic_write_json's temp file is private; the corpus is for every reader
    _report(meta, log)
    return meta


def _check_splits(found: _Collector, leaked: np.ndarray, val_fraction: float) -> None:
    """InputError (exit 65) when a split would be empty: `minilmd train` needs documents to train on and a val
    split for its validation loss. The message gives the smallest --val-fraction that puts a document into val
    (the split rule is a hash of each text: raising the fraction only moves documents from train to val).
    --val-fraction 0 asks for no val split: then only train must not be empty."""
    n, n_val = found.documents, int(leaked.size)
    n_train = n - n_val
    if n_train == 0:
        raise InputError(f"the train split is empty: all {n:,} documents fell into val at --val-fraction "
                         f"{val_fraction}; lower it (the split is by a hash of each text), or add documents")
    if val_fraction == 0 or n_val - int(leaked.sum()) > 0:
        return
    if n_val:
        raise InputError(f"the val split is empty: all {n_val:,} val document(s) repeat train documents (whitespace "
                         f"aside) and were removed by the leak check; raise --val-fraction to draw others")
    need = _round_up(found.train_min_digest / 2**64)
    raise InputError(f"the val split is empty: none of the {n:,} documents fell into val at --val-fraction "
                     f"{val_fraction} (about {n * val_fraction:.2f} expected; the split is by a hash of each text), "
                     f"and `minilmd train` needs a val split for its validation loss. --val-fraction {need} puts at "
                     f"least one document there")


def _round_up(x: float) -> float:
    """x rounded up to two significant digits, strictly above x: a val fraction that takes the document at x."""
    digits = 1 - int(np.floor(np.log10(x))) if x > 0 else 2
    up = float(np.ceil(x * 10**digits) / 10**digits)
    return up if up > x else up + 10.0**-digits


def _open_sources(sources: list[str]) -> list[Source]:
    """Every source opened up front: a missing file fails in a second, not in an hour."""
    opened: list[Source] = []
    try:
        for path in sources:
            opened.append(Source(path))
    except InputError:
        for source in opened:
            source.close()
        raise
    return opened


class _Collector:
    """Takes the encoded blocks in input order: writes the token streams and leak keys, and counts what meta.json
    reports (per source, bad lines, documents with special ids inside)."""

    def __init__(self, tmp: Path, opened: list[Source], on_bad_line: str):
        self.opened, self.on_bad_line = opened, on_bad_line
        self.train = _SplitWriter(tmp / SPLITS[0] / TOKENS)
        self.val_raw = _SplitWriter(tmp / SPLITS[1] / UNCHECKED_VAL_TOKENS)
        self.train_keys = open(tmp / SPLITS[0] / LEAK_KEYS, "wb")
        self.val_keys: list[np.ndarray] = []
        self.val_where: list[np.ndarray] = []  # (source index, line) of each val document, for the leak report
        self.bad_counts: dict[str, int] = {}
        self.bad_examples: list[str] = []
        self.special_examples: list[str] = []
        self.special_docs = 0
        self.text_bytes = 0
        self.train_min_digest = NO_DIGEST  # the train document closest to the val side of the split rule
        self.sources = [{"path": s.path, "bytes": s.size, "lines": 0, "documents": 0, "blank_lines": 0,
                         "bad_lines": 0} for s in opened]
        self.spool = _Spool(tmp / LONG_DOCUMENT_SPOOL)
        self.threshold = 0  # set by _encode_all: the split rule's

    @property
    def documents(self) -> int:
        return sum(m["documents"] for m in self.sources)

    @property
    def tokens(self) -> int:
        return self.train.tokens + self.val_raw.tokens

    def take(self, src_idx: int, kind: str, result) -> None:
        """One result, in input order: a block ("block"), a piece of a long document ("piece"), the long line
        starting over at another "text" key ("restart"), or its end ("long_end")."""
        if kind == "block":
            self.add(src_idx, result)
        elif kind == "piece":
            self.spool.add(*result)
        elif kind == "restart":
            self.spool.reset()
        else:
            self.end_long(src_idx, result)

    def add(self, src_idx: int, block: EncodedBlock) -> None:
        self._lines(src_idx, block.n_lines, block.blank, block.bad)
        self.sources[src_idx]["documents"] += int(block.train_lengths.size + block.val_lengths.size)
        self.text_bytes += block.text_bytes
        self.train_min_digest = min(self.train_min_digest, block.train_min_digest)
        self._special(src_idx, block.special_inside)
        self.train.write(block.train_tokens, block.train_lengths)
        self.train_keys.write(block.train_keys.tobytes())
        self.val_raw.write(block.val_tokens, block.val_lengths)
        self.val_keys.append(block.val_keys)
        self.val_where.append(np.stack([np.full(block.val_lines.size, src_idx), block.val_lines], axis=1))

    def end_long(self, src_idx: int, end: LongEnd) -> None:
        """A long line has been read: a document (its ids are in the spool), a bad line or a blank one."""
        verdict = end.verdict
        bad = [(end.line, *verdict.bad)] if verdict.bad else []
        self._lines(src_idx, 1, int(verdict.blank), bad)
        if verdict.blank or verdict.bad:
            self.spool.reset()
            return
        if self.spool.ids + 2 > np.iinfo(np.int32).max:
            raise InputError(f"{self.opened[src_idx].path}:{end.line}: a document of {self.spool.ids:,} tokens; "
                             f"doc_lengths.npy holds int32 lengths: split it into documents of fewer tokens")
        self.sources[src_idx]["documents"] += 1
        self.text_bytes += end.text_bytes
        self._special(src_idx, [end.line] if self.spool.special else [])
        key = np.array([end.leak_key], dtype=np.uint64)
        if end.digest < self.threshold:
            self.val_raw.write_spooled(self.spool)
            self.val_keys.append(key)
            self.val_where.append(np.array([[src_idx, end.line]], dtype=np.int64))
        else:
            self.train.write_spooled(self.spool)
            self.train_keys.write(key.tobytes())
            self.train_min_digest = min(self.train_min_digest, end.digest)
        self.spool.reset()

    def _lines(self, src_idx: int, n_lines: int, blank: int, bad: list) -> None:
        name = self.opened[src_idx].path
        if bad:
            if self.on_bad_line == "error":
                raise InputError(str(BadLine(name, *bad[0])) + "; nothing was written. Fix the line or "
                                 "pass --on-bad-line skip to skip bad lines and count them")
            for line, reason, detail in bad:
                self.bad_counts[reason] = self.bad_counts.get(reason, 0) + 1
                if len(self.bad_examples) < MAX_EXAMPLES:
                    self.bad_examples.append(str(BadLine(name, line, reason, detail)))
        sm = self.sources[src_idx]
        sm["lines"] += n_lines
        sm["blank_lines"] += blank
        sm["bad_lines"] += len(bad)

    def _special(self, src_idx: int, lines: list[int]) -> None:
        self.special_docs += len(lines)
        for line in lines[:MAX_EXAMPLES - len(self.special_examples)]:
            self.special_examples.append(f"{self.opened[src_idx].path}:{line}")

    def close(self) -> None:
        self.train.close()
        self.val_raw.close()
        self.train_keys.close()
        self.spool.close()


def _encode_all(opened: list[Source], found: _Collector, tok: _Tokenizer, opts: PrepareOptions,
                progress: Progress | bool | None) -> None:
    """Blocks of whole lines, and the pieces of long lines, -> worker processes -> `found`, in input order, a
    bounded number in flight."""
    total_bytes = sum(s.size for s in opened)
    if progress is None or progress is True:
        progress = Progress(total_bytes)
    elif progress is False:
        progress = None
    workers = default_workers() if opts.workers is None else opts.workers
    executor: ProcessPoolExecutor | _InlineExecutor
    if workers > 0:
        executor = ProcessPoolExecutor(workers, initializer=_worker_init,
                                       initargs=(tok.json, opts.val_fraction, os.getpid()),
                                       mp_context=_spawn_context())
    else:
        executor = _InlineExecutor(tok.json, opts.val_fraction)
    found.threshold = int(opts.val_fraction * 2**64)
    pending: deque = deque()
    max_in_flight = 2 * max(workers, 1) + 1
    done_before = 0  # raw bytes of the sources already finished
    src: Source | None = None

    def submit(src_idx: int, kind: str, future: Future) -> None:
        pending.append((src_idx, kind, future))
        while len(pending) >= max_in_flight:
            found.take(*_result(pending.popleft()))
            if progress and src is not None:
                progress.update(done_before + src.position, found.tokens, found.documents)

    try:
        for src_idx, src in enumerate(opened):
            try:
                for item in src.items(opts.block_bytes):
                    if isinstance(item, LongLine):
                        _stream_long_line(item, src_idx, executor, submit)
                    else:
                        first_line, blob = item
                        submit(src_idx, "block", executor.submit(_worker_call, "__call__", blob, first_line))
                done_before += src.size
            finally:
                src.close()
        while pending:
            found.take(*_result(pending.popleft()))
        if progress:
            progress.update(total_bytes, found.tokens, found.documents, force=True)
    finally:
        for _, _, f in pending:
            f.cancel()
        executor.shutdown(wait=True, cancel_futures=True)
        if progress:
            progress.close()
        for s in opened:
            s.close()
        found.close()


def _result(entry: tuple[int, str, Future]) -> tuple[int, str, object]:
    src_idx, kind, future = entry
    return src_idx, kind, future.result()


def _stream_long_line(long: LongLine, src_idx: int, executor, submit) -> None:
    """A line too long to hold, as it is read: parsed in chunks, its text cut into pieces for the workers; its
    end, with the verdict and the hashes of the whole text, follows its pieces."""
    parser = LongLineParser()
    doc = _LongText(lambda piece: submit(src_idx, "piece", executor.submit(_worker_call, "encode_piece", piece)))

    def take(events: list) -> None:
        for event in events:
            if event is RESTART:  # another top-level "text": the last one is the document
                doc.reset()
                submit(src_idx, "restart", _done(None))
            else:
                doc.add(event)

    for chunk in long.chunks():
        take(parser.feed(chunk))
    events, verdict = parser.close()
    take(events)
    doc.finish()
    submit(src_idx, "long_end", _done(LongEnd(long.line, verdict, _digest_int(doc.digest), _digest_int(doc.key),
                                              doc.text_bytes)))


class _LongText:
    """The text of a long line as it streams by: cut into pieces (handed to `send`), hashed on the way for the split
    rule and the leak key of the whole text (blake2b is the same fed in parts)."""

    def __init__(self, send):
        self.send = send
        self.reset()

    def reset(self) -> None:
        self.cutter = PieceCutter()
        self.digest = hashlib.blake2b(digest_size=8)
        self.key = hashlib.blake2b(digest_size=8)
        self.text_bytes = 0
        self.encodable = True  # no lone surrogate so far (with one, the line is bad: nothing more is encoded)

    def add(self, fragment: str) -> None:
        for piece in self.cutter.add(fragment):
            self._piece(piece)

    def finish(self) -> None:
        for piece in self.cutter.finish():
            self._piece(piece)

    def _piece(self, piece: str) -> None:
        if not self.encodable:
            return
        try:
            data = piece.encode("utf-8")
        except UnicodeEncodeError:
            self.encodable = False
            return
        self.digest.update(data)
        self.key.update("".join(piece.split()).encode("utf-8"))
        self.text_bytes += len(data)
        self.send(piece)


def _digest_int(h) -> int:
    return int.from_bytes(h.digest(), "little")


def _done(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


def _leak_check(tmp: Path, found: _Collector, opened: list[Source]) -> tuple[np.ndarray, list[str]]:
    """(leaked: one flag per val document, examples as source:line). Val keys in memory, train keys streamed from
    disk; the train key file is removed after."""
    vkeys = np.concatenate(found.val_keys) if found.val_keys else np.zeros(0, dtype=np.uint64)
    vwhere = np.concatenate(found.val_where) if found.val_where else np.zeros((0, 2), dtype=np.int64)
    leaked = np.zeros(vkeys.size, dtype=bool)
    keys_path = tmp / SPLITS[0] / LEAK_KEYS
    if vkeys.size:
        with open(keys_path, "rb") as f:
            for block in iter(lambda: f.read(8 << 20), b""):
                leaked |= np.isin(vkeys, np.frombuffer(block, dtype=np.uint64))
    keys_path.unlink()
    return leaked, [f"{opened[int(s)].path}:{int(line)}" for s, line in vwhere[leaked][:MAX_EXAMPLES]]


def _write_splits(tmp: Path, found: _Collector, leaked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """val's tokens.bin without its leaked documents, and both splits' doc_lengths.npy; returns the lengths."""
    val_lengths_all = found.val_raw.all_lengths().astype(np.int64)
    keep = ~leaked
    _copy_kept(found.val_raw.path, val_lengths_all, keep, tmp / SPLITS[1] / TOKENS)
    found.val_raw.path.unlink()
    train_lengths = found.train.all_lengths()
    val_lengths = val_lengths_all[keep].astype(np.int32)
    np.save(tmp / SPLITS[0] / DOC_LENGTHS, train_lengths)
    np.save(tmp / SPLITS[1] / DOC_LENGTHS, val_lengths)
    return train_lengths, val_lengths


def _copy_kept(src: Path, lengths: np.ndarray, keep: np.ndarray, dst: Path, chunk: int = 8 << 20) -> None:
    """dst = the documents of the token file src whose `keep` is set, copied run by run in bounded chunks."""
    bounds = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    edges = np.flatnonzero(np.diff(np.concatenate([[0], keep.astype(np.int8), [0]])))  # kept runs: [start, end)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        for first, last in edges.reshape(-1, 2):
            fin.seek(2 * int(bounds[first]))
            left = 2 * int(bounds[last] - bounds[first])
            while left:
                data = fin.read(min(chunk, left))
                if not data:
                    raise CorpusError(f"{src}: ends {left} bytes early (written by this prepare a moment ago)")
                fout.write(data)
                left -= len(data)


def _file_table(tmp: Path, train_tokens_sha: str) -> dict[str, dict]:
    """Size and sha256 of every file, as meta.json lists them (train tokens were hashed while written)."""
    files = {}
    for rel in [split_file(s, n) for s in SPLITS for n in (TOKENS, DOC_LENGTHS)] + [CORPUS_TOKENIZER]:
        path = tmp / rel
        sha = train_tokens_sha if rel == split_file(SPLITS[0], TOKENS) else sha256_file(path)
        files[rel] = {"size": path.stat().st_size, "sha256": sha}
    return files


def _meta(tmp: Path, tok: _Tokenizer, opts: PrepareOptions, found: _Collector, train_lengths: np.ndarray,
          val_lengths: np.ndarray, leaked: np.ndarray, leak_examples: list[str]) -> dict:
    """meta.json's content."""
    stats = {
        "train": corpus_stats.split_stats(train_lengths, opts.seq_len, opts.batch_size),
        "val": corpus_stats.split_stats(val_lengths, opts.seq_len, opts.batch_size),
        "documents_with_special_ids_inside": found.special_docs,
        "special_ids_inside_examples": found.special_examples,
        "input_text_bytes": found.text_bytes,
    }
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "vocab_size": tok.vocab_size,
        "special_ids": {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID},
        "tokenizer_sha256": sha256_file(tmp / CORPUS_TOKENIZER),
        "token_dtype": "uint16 little-endian",
        "doc_lengths_dtype": "int32",
        "document_layout": "[BOS] ids [EOS], no PAD stored; doc length counts BOS and EOS",
        "splits": {
            "train": {"documents": int(train_lengths.size), "tokens": int(train_lengths.sum())},
            "val": {"documents": int(val_lengths.size), "tokens": int(val_lengths.sum())},
        },
        "files": _file_table(tmp, found.train.sha.hexdigest()),
        "sources": found.sources,
        "split_rule": {
            "rule": "val iff int.from_bytes(blake2b(text.encode('utf-8'), digest_size=8).digest(), 'little') "
                    "< val_fraction * 2**64",
            "val_fraction": opts.val_fraction,
        },
        "leak_check": {
            "key": "blake2b-64 of the text with all whitespace removed (exact duplicates share a split by the rule)",
            "val_documents_checked": int(leaked.size),
            "leaked_documents": int(leaked.sum()),
            "removed_from_val": int(leaked.sum()),
            "examples": leak_examples,
        },
        "stats": stats,
        "bad_lines": {"policy": opts.on_bad_line, "total": sum(found.bad_counts.values()),
                      "by_reason": dict(sorted(found.bad_counts.items())), "examples": found.bad_examples},
    }


def _spawn_context():
    # spawn, not fork: the parent may hold threads (progress, fsspec) or, inside the trainer, torch state.
    import multiprocessing

    return multiprocessing.get_context("spawn")


def _report(meta: dict, log) -> None:
    stats = meta["stats"]
    log(corpus_stats.format_report("train", stats["train"]))
    v = meta["splits"]["val"]
    fraction = meta["split_rule"]["val_fraction"]
    log(f"val: {v['documents']:,} documents, {v['tokens']:,} tokens (val fraction {fraction})")
    lc = meta["leak_check"]
    log(f"leak check: {lc['leaked_documents']:,} of {lc['val_documents_checked']:,} val documents also in train "
        f"(whitespace ignored), removed from val" + (f": {', '.join(lc['examples'])}" if lc["examples"] else ""))
    if v["documents"] == 0:
        log("warning: --val-fraction 0: no val split; `minilmd train` refuses a corpus without one")
    bad = meta["bad_lines"]
    if bad["total"]:
        counts = ", ".join(f"{reason.replace('_', ' ')} {n:,}" for reason, n in bad["by_reason"].items())
        log(f"skipped {bad['total']:,} bad lines: {counts}")
    if stats["documents_with_special_ids_inside"]:
        log(f"warning: {stats['documents_with_special_ids_inside']:,} documents contain a literal special token "
            f"(<|endoftext|>, <|im_start|> or <|im_end|>) that encodes to id 0/1/2 inside the document, e.g. "
            f"{', '.join(stats['special_ids_inside_examples'][:3])}")
