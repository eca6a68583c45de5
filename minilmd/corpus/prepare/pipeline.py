"""`minilmd prepare`: JSONL corpora -> a prepared corpus of packed uint16 token streams (format:
minilmd/corpus/format.py).

The pipeline streams: the main process reads blocks of whole lines and hands them to worker processes
(minilmd/corpus/prepare/encode.py), which parse, split, and encode them and send back uint16 arrays; a line longer than
a block is parsed here as it is read (minilmd/corpus/sources/longdoc.py) and its text goes to the workers in pieces. The
results are collected in input order (minilmd/corpus/prepare/collect.py), so the output does not depend on the number of
workers or the block size. At most a few blocks or pieces are in flight: memory stays bounded by the block and
piece sizes, not by the corpus or a document. Everything is written into a temporary directory beside DIR and
published at the end (every file fsynced, then one rename): an interrupted or failed prepare leaves nothing under
DIR, and `--force` replaces only a prepared corpus or an empty directory.

Split: a document goes to val when the first 8 bytes of blake2b(text) read as an integer are below val_fraction *
2**64. The split of a document therefore depends on its text alone (stable when lines are appended), and exact
duplicates always share a split. Leak check: a val document whose text equals a train document's text once all
whitespace is removed is reported and removed from val. A corpus whose train or val split would be empty is
refused (`minilmd train` needs both), except for val with --val-fraction 0.

`--format chat` (data_format "chat"): each line is a conversation (minilmd/corpus/chat.py), rendered by the
tokenizer's chat template, encoded with its loss mask and cut at seq_len (minilmd/corpus/prepare/chat_encode.py); the
split rule and the leak key apply to its canonical JSON. A chat line is held whole (no streaming of long lines: a
conversation is bounded by what the template renders, and seq_len cuts it; chat_encode.py bounds its length). The
template travels with the corpus: its tokenizer_config.json is written beside tokenizer.json, listed in meta.json's
files.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minilmd.corpus.analysis import stats as corpus_stats
from minilmd.corpus.analysis.report import add_report_meta, check_line_counts, duplicates_of, prepare_summary
from minilmd.corpus.analysis.scripts import script_matrix
from minilmd.corpus.format import DATA_FORMATS, FORMAT, open_prepared
from minilmd.corpus.prepare.chat_encode import chat_blocks, longest_token, text_limit
from minilmd.corpus.prepare.collect import Collector, LongEnd, leak_check, write_splits
from minilmd.corpus.prepare.encode import EncodedBlock, Encoders, default_workers, done
from minilmd.corpus.prepare.encode import leak_key as leak_key  # the split rule: part of prepare's interface
from minilmd.corpus.prepare.encode import split_is_val as split_is_val
from minilmd.corpus.sources.jsonl import BAD_LINE_POLICIES, InputError, LongLine, Source
from minilmd.corpus.sources.longdoc import PieceCutter, parse_chunks
from minilmd.corpus.tokenizer import load_tokenizer
from minilmd.fsio import atomic_write_json, publish_dir, sha256_file
from minilmd.names import CORPUS_META as META
from minilmd.names import (
    CORPUS_TOKENIZER,
    DOC_LENGTHS,
    LOSS_MASK,
    SPLITS,
    TOKENIZER_CONFIG,
    TOKENS,
    prepare_aside_name,
    prepare_tmp_name,
    prepare_tmp_owner_pid,
    split_file,
)
from minilmd.protocol import BOS_ID, EOS_ID, PAD_ID

BLOCK_BYTES = 1 << 20


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
    """Sequence length of the padding/packing report (a text corpus does not depend on it); a chat corpus's
    conversations are cut at it (or dropped: on_long)."""
    batch_size: int = 32
    """Batch size of the steps-per-epoch report; a chat corpus's micro-batch of the bucketed PAD share."""
    workers: int | None = None
    """Encoding processes; None: one per core, 0: in this process."""
    block_bytes: int = BLOCK_BYTES
    """Input bytes per work item; a few blocks per worker are in flight, so memory is bounded by this."""
    data_format: str = "text"
    """"text": {"text": ...} lines, loss on every token; "chat": conversations and a loss mask (`--format`)."""
    on_long: str = "cut"
    """chat: a conversation longer than seq_len is cut to seq_len tokens ("cut") or dropped ("drop")."""
    drop_scripts: frozenset[str] = frozenset()
    """text: a document with any character of these scripts (minilmd/corpus/analysis/scripts.py) is dropped and
    counted."""

    def problems(self) -> list[str]:
        """Every invalid option at once, each naming its flag."""
        from minilmd.corpus.prepare.chat_encode import ON_LONG

        found = []
        if self.data_format not in DATA_FORMATS:
            found.append(f"--format {self.data_format!r}: choose one of {', '.join(DATA_FORMATS)}")
        if self.drop_scripts and self.data_format == "chat":
            found.append("--drop-scripts: applies to text corpora (--format text) only")
        if self.on_long not in ON_LONG:
            found.append(f"--on-long {self.on_long!r}: choose one of {', '.join(ON_LONG)}")
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
    chat_config: dict | None = None
    """chat: its tokenizer_config.json, the template resolved (chat.read_tokenizer_config)."""

    @classmethod
    def load(cls, tokenizer: str | Path, chat: bool = False) -> _Tokenizer:
        from minilmd.corpus.chat import ChatTemplate, read_tokenizer_config

        path = Path(tokenizer)
        if path.is_dir():
            path = path / CORPUS_TOKENIZER
        tok = load_tokenizer(path)
        config = None
        if chat:
            config = read_tokenizer_config(path)
            ChatTemplate.from_config(config)  # compiles: a broken template fails here, before any work
        return cls(path, path.read_text(encoding="utf-8"), tok.get_vocab_size(with_added_tokens=True), config)

    def chat_spec(self, opts: PrepareOptions):
        from minilmd.corpus.chat import ChatTemplate
        from minilmd.corpus.prepare.chat_encode import ChatSpec

        if self.chat_config is None:
            return None
        return ChatSpec(ChatTemplate.from_config(self.chat_config), opts.seq_len, opts.on_long)


def prepare(sources: list[str], tokenizer: str | Path, out: str | Path, *, val_fraction: float = 0.005,
            on_bad_line: str = "error", seq_len: int = 340, batch_size: int = 32, workers: int | None = None,
            block_bytes: int = BLOCK_BYTES, force: bool = False, progress: Progress | bool | None = None,
            log=None, data_format: str = "text", on_long: str = "cut",
            drop_scripts: frozenset[str] = frozenset()) -> dict:
    """Prepare `sources` into `out`; returns meta.json's content. Raises InputError (bad input) or ValueError
    (chat.ChatError for a tokenizer without a chat template, with --format chat)."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    opts = PrepareOptions(val_fraction, on_bad_line, seq_len, batch_size, workers, block_bytes, data_format,
                          on_long, frozenset(drop_scripts))
    problems = opts.problems() + ([] if sources else ["no corpus files given"])
    if problems:
        raise ValueError("; ".join(problems))
    out = Path(out)
    if out.exists() or out.is_symlink():
        if not force:
            raise ValueError(f"{out} already exists; pass --force to replace it")
        _check_replaceable(out)
    tok = _Tokenizer.load(tokenizer, opts.data_format == "chat")
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


CORPUS_ENTRIES = {META, CORPUS_TOKENIZER, TOKENIZER_CONFIG, *SPLITS}
"""What a prepared corpus holds at its top (TOKENIZER_CONFIG: chat only); each split directory holds SPLIT_FILES."""


SPLIT_FILES = {TOKENS, DOC_LENGTHS, LOSS_MASK}


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
    if tok.chat_config is not None:
        (tmp / TOKENIZER_CONFIG).write_text(json.dumps(tok.chat_config, indent=2, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
    opened = _open_sources(sources)
    found = Collector(tmp, opened, opts.on_bad_line, chat=tok.chat_config is not None)
    _encode_all(opened, found, tok, opts, progress)
    if found.documents == 0:
        dropped = sum(found.chat_counts.get(k, 0) for k in ("dropped_long", "dropped_no_target"))
        why = f"; {dropped:,} conversations dropped for length at --seq-len {opts.seq_len}" if dropped else ""
        raise InputError(f"{', '.join(sources)}: no documents (every line was blank or bad{why})")
    check_line_counts(found)
    duplicates = duplicates_of(tmp, found)  # before leak_check, which deletes train's keys
    leaked, leak_examples = leak_check(tmp, found, opened)
    _check_splits(found, leaked, opts.val_fraction)
    train_lengths, val_lengths = write_splits(tmp, found, leaked)
    meta = _meta(tmp, tok, opts, found, train_lengths, val_lengths, leaked, leak_examples)
    add_report_meta(meta, found, duplicates, train_lengths, val_lengths, opts.drop_scripts)
    if found.chat:
        _add_chat_meta(meta, tok, opts, found, train_lengths, val_lengths, leaked)
    atomic_write_json(tmp / META, meta)
    os.chmod(tmp / META, 0o644)  # atomic_write_json's temp file is private; the corpus is for every reader
    _report(meta, log)
    return meta


def _check_splits(found: Collector, leaked: np.ndarray, val_fraction: float) -> None:
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


def _encode_all(opened: list[Source], found: Collector, tok: _Tokenizer, opts: PrepareOptions,
                progress: Progress | bool | None) -> None:
    """Blocks of whole lines, and the pieces of long lines, -> worker processes -> `found`, in input order, a
    bounded number in flight."""
    total_bytes = sum(s.size for s in opened)
    if progress is None or progress is True:
        progress = Progress(total_bytes)
    elif progress is False:
        progress = None
    workers = default_workers() if opts.workers is None else opts.workers
    chat = tok.chat_spec(opts)
    encoders = Encoders(tok.json, opts.val_fraction, workers, chat, opts.drop_scripts)
    found.threshold = int(opts.val_fraction * 2**64)
    found.drop_scripts = opts.drop_scripts
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
                # A chat line is held whole (the module docstring), up to chat_encode's bound.
                items = src.items(opts.block_bytes) if chat is None else chat_blocks(
                    src, opts.block_bytes, text_limit(chat.seq_len, longest_token(tok.json)))
                for item in items:
                    if isinstance(item, LongLine):
                        _stream_long_line(item, src_idx, encoders, submit)
                    elif isinstance(item, EncodedBlock):  # a chat line too long to hold: a bad line
                        submit(src_idx, "block", done(item))
                    else:
                        first_line, blob = item
                        submit(src_idx, "block", encoders.submit("__call__", blob, first_line))
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
        encoders.shutdown()
        if progress:
            progress.close()
        for s in opened:
            s.close()
        found.close()


def _result(entry: tuple[int, str, Future]) -> tuple[int, str, object]:
    src_idx, kind, future = entry
    return src_idx, kind, future.result()


def _stream_long_line(long: LongLine, src_idx: int, encoders: Encoders, submit) -> None:
    """A line too long to hold, as it is read: parsed in chunks, its text cut into pieces for the workers; its
    end, with the verdict and the hashes of the whole text, follows its pieces."""
    doc = _LongText(lambda piece: submit(src_idx, "piece", encoders.submit("encode_piece", piece)))

    def restart() -> None:  # another top-level "text": the last one is the document
        doc.reset()
        submit(src_idx, "restart", done(None))

    verdict = parse_chunks(long.chunks(), doc.add, restart)
    doc.finish()
    submit(src_idx, "long_end", done(LongEnd(long.line, verdict, _digest_int(doc.digest), _digest_int(doc.key),
                                              doc.text_bytes, doc.scripts)))


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
        self.scripts = script_matrix([])[:1].sum(axis=0)  # its characters by script, piece by piece
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
        self.scripts = self.scripts + script_matrix([piece])[0]
        self.send(piece)


def _digest_int(h) -> int:
    return int.from_bytes(h.digest(), "little")


def _file_table(tmp: Path, train_tokens_sha: str, chat: bool = False) -> dict[str, dict]:
    """Size and sha256 of every file, as meta.json lists them (train tokens were hashed while written)."""
    files = {}
    names = (TOKENS, DOC_LENGTHS, LOSS_MASK) if chat else (TOKENS, DOC_LENGTHS)
    top = [CORPUS_TOKENIZER, TOKENIZER_CONFIG] if chat else [CORPUS_TOKENIZER]
    for rel in [split_file(s, n) for s in SPLITS for n in names] + top:
        path = tmp / rel
        sha = train_tokens_sha if rel == split_file(SPLITS[0], TOKENS) else sha256_file(path)
        files[rel] = {"size": path.stat().st_size, "sha256": sha}
    return files


def _meta(tmp: Path, tok: _Tokenizer, opts: PrepareOptions, found: Collector, train_lengths: np.ndarray,
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
        "version": DATA_FORMATS[opts.data_format],
        "data_format": opts.data_format,
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
        "files": _file_table(tmp, found.train.sha.hexdigest(), found.chat),
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


def _add_chat_meta(meta: dict, tok: _Tokenizer, opts: PrepareOptions, found: Collector,
                   train_lengths: np.ndarray, val_lengths: np.ndarray, leaked: np.ndarray) -> None:
    """A chat corpus's meta.json: its figures per split replace the text ones (packing does not apply), the
    target tokens per split, the length rule and what it cut and dropped."""
    assert tok.chat_config is not None
    facts = {"train": found.train.all_facts(), "val": found.val_raw.all_facts()[~leaked]}
    lengths = {"train": train_lengths, "val": val_lengths}
    stats = meta["stats"]
    for split in SPLITS:
        stats[split] = corpus_stats.chat_split_stats(lengths[split], facts[split], opts.seq_len, opts.batch_size)
        meta["splits"][split]["target_tokens"] = stats[split]["target_tokens"]
    counts = found.chat_counts
    meta["chat"] = {
        "seq_len": opts.seq_len,
        "on_long": opts.on_long,
        "cut": sum(stats[split]["cut"] for split in SPLITS),
        "dropped_long": counts.get("dropped_long", 0),
        "dropped_no_target": counts.get("dropped_no_target", 0),
        "conversations_with_special_text": counts.get("special_text", 0),
        "template_sha256": hashlib.sha256(tok.chat_config["chat_template"].encode("utf-8")).hexdigest(),
        "target_rule": "every token of an assistant reply after its '<|im_start|>assistant\\n' header up to and "
                       "including its '<|im_end|>'; a token counts where its first character is",
    }
    meta["split_rule"]["text"] = "a conversation's canonical JSON: its messages, keys sorted, compact, UTF-8"


def _report_chat(meta: dict, log) -> None:
    for split in SPLITS:
        log(corpus_stats.format_chat_report(split, meta["stats"][split]))
    c = meta["chat"]
    if c["dropped_long"] or c["dropped_no_target"]:
        log(f"dropped: {c['dropped_long']:,} conversations longer than seq_len {c['seq_len']} (--on-long drop), "
            f"{c['dropped_no_target']:,} whose replies all fall past the cut")


def _report(meta: dict, log) -> None:
    stats = meta["stats"]
    if meta["data_format"] == "chat":
        _report_chat(meta, log)
    else:
        log(corpus_stats.format_report("train", stats["train"]))
    for line in prepare_summary(meta):
        log(line)
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
