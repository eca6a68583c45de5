"""Reading every document of a corpus once, in parallel, for `minilmd corpus report` and `minilmd corpus count`.

A corpus is either JSONL (the input of prepare) or a prepared corpus (its output). It is cut into shards that
worker processes read independently:
- a plain local JSONL file: byte ranges; a shard holds the lines that START in its range (it skips the partial
  line at its start, which belongs to the shard before, and reads past its end to finish its last line). A
  compressed or remote file is one shard, read as a stream.
- a prepared corpus: ranges of documents of each split (the first meta.json's `documents` of it), decoded with the
  corpus's own tokenizer, so a pattern is counted in the text the model is trained on: a text document is its ids
  between BOS and EOS, decoded back to its exact text (byte-level BPE). A chat one is its messages' content, not
  the template around it (role names, a default system prompt, empty think blocks are in every conversation and
  would count as content: "assistant" in 100 % of documents, every corpus "latin"): the conversation is cut at its
  special tokens (<|im_start|>, <|im_end|>, BOS ...) into turns; a turn with tokens under the loss mask gives those
  tokens (the assistant's reply, an empty <think></think> block before it dropped, and so is the start of one where
  seq_len cut the conversation); a turn without any whose first
  line is `user` gives the rest of it (the user's message). Other unmasked turns (system prompts: the template's
  default one cannot be told from the data's; assistant turns the template does not train on) are not counted:
  the JSONL, read as below, has every message's content.
A line's text is its "text" field; a chat line's ({"conversations": [...]}) is its messages' "content" joined by
newlines; a preference pair's ({"chosen": [...], "rejected": [...]}) the chosen side's and the rejected reply's. A
prepared preference corpus is read side by side (each side a document, its mask on its final reply). Lines that
are not JSON (or nest deeper than jsonl.MAX_JSON_DEPTH) or have neither are counted as bad, never read. JSONL is read
as every corpus reader reads it (jsonl.Source.blocks): a line longer than jsonl.MAX_LINE_BYTES is read through,
never held, counted as bad and named (`FILE:LINE: line too long (...)`, its number counted over the shards before
it).

Each shard feeds a Task (texts, their exact digests, their lengths) and returns its result; the results come back
in shard order and the caller merges them. Memory per worker: one block of lines or documents (a line of up to
MAX_LINE_BYTES).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from minilmd.corpus.digest import digest64
from minilmd.corpus.format import map_regular, read_doc_lengths
from minilmd.corpus.sources.bad_tally import BadLineTally
from minilmd.corpus.sources.jsonl import (
    OverLong,
    ParsedBlock,
    Source,
    SourceNotOpened,
    compressed,
    json_lines,
    not_opened,
    open_regular,
)
from minilmd.corpus.sources.local import real_source
from minilmd.corpus_meta import CorpusError, read_meta
from minilmd.names import CORPUS_META, CORPUS_TOKENIZER, DOC_LENGTHS, LOSS_MASK, SPLITS, TOKENIZER_MAX_BYTES, TOKENS
from minilmd.place_rule import PlaceRefused
from minilmd.raw_corpus import CHAT_KEYS
from minilmd.untrusted import Unreadable, read_bytes
from minilmd.urls import is_url

BLOCK_BYTES = 4 << 20  # JSONL bytes per batch of texts handed to a task
BLOCK_DOCS = 4096  # prepared documents per batch


@dataclass(frozen=True)
class Shard:
    """A piece of one corpus file: bytes [start, end) of a JSONL file, or documents [start, end) of a split."""
    path: str
    start: int
    end: int
    split: str = ""  # prepared corpora: "train" or "val"; "" for JSONL


@dataclass
class Batch:
    """What a task sees: texts, the blake2b-64 of each document's exact bytes (its UTF-8 line text, or its token
    ids for a prepared corpus), and each one's length (characters for JSONL, tokens with BOS/EOS for prepared)."""
    texts: list[str]
    digests: np.ndarray
    lengths: np.ndarray
    bad_lines: int = 0
    blank_lines: int = 0
    lines: int = 0  # JSONL: every line of the batch, documents, bad and blank
    too_long: list[tuple[int, str, str]] = field(default_factory=list)  # (line in the shard, reason, detail)


@dataclass
class LinesRead:
    """A shard's lines that are not documents: the bad and blank ones counted, the over-long ones by their number in
    the shard, and all its lines (`lines`), which number the lines of the shards after it (`too_long_named`)."""
    lines: int = 0
    bad: int = 0
    blank: int = 0
    too_long: list[tuple[int, str, str]] = field(default_factory=list)

    def add(self, batch: Batch) -> None:
        self.lines += batch.lines
        self.bad += batch.bad_lines
        self.blank += batch.blank_lines
        self.too_long += batch.too_long


def too_long_named(path: str, shards: list[LinesRead]) -> BadLineTally:
    """The over-long lines of every shard (in shard order), named as prepare names a bad line: `FILE:LINE: line too
    long (...)`, the line numbered in the whole file."""
    tally, before = BadLineTally(), 0
    for read in shards:
        for line, reason, detail in read.too_long:
            tally.add(path, before + line, reason, detail)
        before += read.lines
    return tally


def too_long_said(result: dict) -> str:
    """` (N too long)` after the bad lines `corpus report` and `count` print, when some were (too_long_named)."""
    return f" ({result['too_long_lines']:,} too long)" if result.get("too_long_lines") else ""


@dataclass
class Corpus:
    """A corpus to scan: its kind ("jsonl" | "prepared"), its shards, and for a prepared corpus its meta.json."""
    path: str
    kind: str
    shards: list[Shard]
    meta: dict | None = None
    tokenizer_json: str | None = field(default=None, repr=False)


def is_prepared(path: str) -> bool:
    return (Path(path) / CORPUS_META).is_file()


def user_path(path: str) -> str:
    """The corpus a user named (`corpus report`, `corpus count`), its links followed by the one link rule
    (sources/local.py: LinkRefused, exit 2, for another user's link on the way to what is not his): its real path
    when a link was followed, which the report then names, else as given. Not for the corpus an append reads
    through its locked directory's descriptor (/proc/PID/fd/N: a link of the process's own, read as it is)."""
    if is_url(path):
        return path
    real, _ = real_source(path)
    return path if real == Path(os.path.abspath(path)) else str(real)


def open_corpus(path: str, parts: int, min_bytes: int = 1 << 20) -> Corpus:
    """The shards of `path` (about `parts` of them, JSONL ones of at least min_bytes); CorpusError / InputError for
    what cannot be read. `path` as the caller has it: a user's through user_path first."""
    if is_prepared(path):
        meta = read_meta(path)
        shards = []
        total = sum(int(meta["splits"][s]["documents"]) for s in SPLITS)
        per = max(1, -(-total // max(parts, 1)))
        for split in SPLITS:
            n = int(meta["splits"][split]["documents"])
            shards += [Shard(path, lo, min(lo + per, n), split) for lo in range(0, n, per)]
        try:  # a corpus another user may have written: bounded, no link followed, no FIFO opened
            tok = read_bytes(Path(path) / CORPUS_TOKENIZER, max_bytes=TOKENIZER_MAX_BYTES).decode("utf-8")
        except Unreadable as e:
            raise CorpusError(f"{path}: its {CORPUS_TOKENIZER} cannot be read: {e.why}") from None
        except UnicodeDecodeError:
            raise CorpusError(f"{path}: its {CORPUS_TOKENIZER} is not UTF-8 text") from None
        return Corpus(path, "prepared", shards, meta, tok)
    if Path(path).is_dir():  # given where a JSONL file or a prepared corpus is asked: a bad argument (exit 2)
        raise SourceNotOpened(f"{path}: a directory without {CORPUS_META}: not a prepared corpus, nor a JSONL file")
    if is_url(path) or compressed(path):
        return Corpus(path, "jsonl", [Shard(path, 0, -1)])  # one stream: a compressed file has no byte offsets
    try:
        with open_regular(path) as f:  # a FIFO or a device is refused here, never opened blocking
            size = os.fstat(f.fileno()).st_size
    except PlaceRefused:
        raise
    except (OSError, ValueError) as e:
        raise not_opened(path, e) from None
    per = max(min_bytes, -(-size // max(parts, 1)), 1)
    return Corpus(path, "jsonl", [Shard(path, lo, min(lo + per, size)) for lo in range(0, size, per)] or
                  [Shard(path, 0, 0)])


def run(corpus: Corpus, task, workers: int) -> list:
    """task.result() of every shard, in shard order; workers=0 runs them in this process."""
    if workers <= 0 or len(corpus.shards) == 1:
        return [run_shard(corpus, shard, task) for shard in corpus.shards]
    from minilmd.corpus.workers import WorkerPool

    pool = WorkerPool(min(workers, len(corpus.shards)))  # deaf to Ctrl-C, dead with this process
    shipped = _for_workers(corpus)
    try:
        futures = [pool.submit(run_shard, shipped, shard, task) for shard in corpus.shards]
        return [f.result() for f in futures]
    finally:
        pool.close()  # on a Ctrl-C: the shards not begun cancelled, not all read first


def _for_workers(corpus: Corpus) -> Corpus:
    """The corpus as a worker needs it: of meta.json only what _prepared_batches reads (data_format, each split's
    documents), so that a meta.json padded with megabytes of junk (another user's corpus) is not pickled to every
    shard and parsed again there (`corpus report` of a 63 MiB one took 226 s)."""
    if corpus.meta is None:
        return corpus
    splits = corpus.meta.get("splits") or {}
    meta = {"data_format": corpus.meta.get("data_format", "text"),
            "splits": {s: {"documents": splits[s]["documents"]} for s in SPLITS if s in splits}}
    return replace(corpus, meta=meta)


def run_shard(corpus: Corpus, shard: Shard, task):
    """Feed every batch of `shard` to a fresh copy of `task` (tasks are small dataclasses) and return its result."""
    task = task.fresh()
    batches = _prepared_batches(corpus, shard) if corpus.kind == "prepared" else _jsonl_batches(shard)
    for batch in batches:
        task.add(batch)
    return task.result()


def line_text(obj) -> str | None:
    """A JSONL line's text (the module docstring), None when it has none."""
    if not isinstance(obj, dict):
        return None
    text = obj.get("text")
    if isinstance(text, str):
        return text
    conv = next((obj[key] for key in CHAT_KEYS if key in obj), None)  # "conversations" or "messages"
    if isinstance(conv, list):
        return _contents(conv)
    chosen, rejected = obj.get("chosen"), obj.get("rejected")
    if isinstance(chosen, list) and isinstance(rejected, list) and rejected:
        return _contents(chosen + rejected[-1:])  # the prompt once, both replies
    return None


def _contents(messages: list) -> str | None:
    """The messages' "content" joined by newlines; None when one has none (a null content beside tool_calls is "",
    as prepare reads it: chat_tools.py)."""
    parts = ["" if m.get("content") is None and m.get("tool_calls") else m.get("content")
             for m in messages if isinstance(m, dict)]
    texts = [p for p in parts if isinstance(p, str)]
    return "\n".join(texts) if texts and len(texts) == len(messages) else None


def _jsonl_batches(shard: Shard):
    """A JSONL shard's batches: a plain file's lines that start in its byte range, a stream's all (shard.end -1)."""
    src = Source(shard.path)
    try:
        for item in src.blocks(BLOCK_BYTES, start=shard.start, end=None if shard.end < 0 else shard.end):
            if isinstance(item, OverLong):
                yield Batch([], np.zeros(0, np.uint64), np.zeros(0, np.int64), bad_lines=1, lines=1,
                            too_long=[item.bad])
            else:
                yield _parse_lines(*item)
    finally:
        src.close()


def _parse_lines(first: int, blob: bytes) -> Batch:
    """The documents of whole lines of JSONL (jsonl.json_lines: a line not UTF-8 or not JSON is bad)."""
    texts, digests, counts = [], [], ParsedBlock()
    bad = 0
    for _, obj, not_json in json_lines(blob, first, counts):
        text = None if not_json else line_text(obj)
        if text is None or not text.strip():
            bad += 1
            continue
        data = text.encode("utf-8", "surrogatepass")
        texts.append(text)
        digests.append(digest64(data))
    return Batch(texts, np.array(digests, dtype=np.uint64), np.array([len(t) for t in texts], dtype=np.int64),
                 bad, counts.blank, counts.n_lines)


def _prepared_batches(corpus: Corpus, shard: Shard):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(corpus.tokenizer_json or "")
    text = (corpus.meta or {}).get("data_format", "text") == "text"
    split_dir = Path(corpus.path) / shard.split
    n_docs = int((corpus.meta or {})["splits"][shard.split]["documents"])
    # the files of a corpus that may sit in a team directory: no link followed, no FIFO opened, bounded reads (a
    # longer doc_lengths.npy or tokens.bin: an append publishing; its prefix is this version)
    lengths = read_doc_lengths(split_dir / DOC_LENGTHS, n_docs)
    starts = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    if not starts[-1]:
        return
    tokens = map_regular(split_dir / TOKENS, "<u2", int(starts[-1]))
    mask = None if text else map_regular(split_dir / LOSS_MASK, np.uint8, int(starts[-1]))
    special = np.array([i for i, t in tok.get_added_tokens_decoder().items() if t.special], dtype=np.int64)
    for lo in range(shard.start, shard.end, BLOCK_DOCS):
        hi = min(lo + BLOCK_DOCS, shard.end)
        docs = [np.asarray(tokens[starts[d]:starts[d + 1]]) for d in range(lo, hi)]
        if mask is None:  # between BOS and EOS, every id: a literal "<|endoftext|>" in a text is part of it
            texts = tok.decode_batch([d[1:-1].tolist() for d in docs], skip_special_tokens=False)
        else:
            masks = [np.asarray(mask[starts[d]:starts[d + 1]]) for d in range(lo, hi)]
            texts = chat_content(tok, docs, masks, special)
        digests = np.array([digest64(d.tobytes()) for d in docs], dtype=np.uint64)
        yield Batch(texts, digests, lengths[lo:hi].copy())


EMPTY_THINK = re.compile(r"^\s*<think>\s*</think>\s*")
"""The empty reasoning block a MiniMind template writes before every reply (under the loss mask: the model learns
to write it), not content."""


def chat_content(tok, docs: list[np.ndarray], masks: list[np.ndarray], special: np.ndarray) -> list[str]:
    """Each conversation's content as the module docstring says: the replies under the loss mask and the user
    turns, joined by newlines. One decode_batch over every turn of the block."""
    turns: list[tuple[int, bool, np.ndarray]] = []  # (conversation, a reply, its ids)
    for i, (ids, mask) in enumerate(zip(docs, masks, strict=True)):
        cuts = [-1, *np.flatnonzero(np.isin(ids, special)).tolist(), len(ids)]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            if b - a > 1:
                trained = mask[a + 1:b].astype(bool)
                turn = ids[a + 1:b]
                turns.append((i, True, turn[trained]) if trained.any() else (i, False, turn))
    decoded = tok.decode_batch([t.tolist() for _, _, t in turns], skip_special_tokens=True)
    parts: list[list[str]] = [[] for _ in docs]
    for (i, reply, _), text in zip(turns, decoded, strict=True):
        if reply:
            text = EMPTY_THINK.sub("", text)
            if "<think></think>".startswith("".join(text.split())):
                continue  # only the start of that block: the conversation was cut at seq_len inside it
        else:
            role, newline, text = text.partition("\n")
            if not newline or role.strip() != "user":
                continue
        if text.strip():
            parts[i].append(text)
    return ["\n".join(p) for p in parts]


def per_split(root: Path, task, workers: int) -> dict[str, np.ndarray]:
    """{split: the uint64 `task` gives each of its documents, in order}: the corpus scanned in parallel shards."""
    corpus = open_corpus(str(root), max(workers, 1) * 4)
    parts = run(corpus, task, workers)
    out = {}
    for split in SPLITS:
        got = [k for shard, k in zip(corpus.shards, parts, strict=True) if shard.split == split]
        out[split] = np.concatenate(got) if got else np.zeros(0, dtype=np.uint64)
    return out
