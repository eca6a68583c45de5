"""Collecting what the workers encoded, in input order, into the two splits of a prepared corpus.

`Collector` writes train's tokens.bin and val's unchecked stream as results come (hashing train's as it goes),
spools a long document until its end decides its split, keeps the per-document facts meta.json reports (lengths,
leak keys, where each val document came from) and the counts per source. `leak_check` and `write_splits` finish the
splits: a val document whose text equals a train document's once whitespace is removed is dropped from val. Only
per-document facts are held in memory (train's leak keys go through a file); tokens are copied in bounded chunks.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from minilmd.corpus.prepare.badlines import SHOWN, SPOOL, BadLines
from minilmd.corpus.prepare.block import NO_DIGEST, EncodedBlock
from minilmd.corpus.sources.jsonl import InputError, Source
from minilmd.corpus.sources.line_shape import advice, json_document_advice, mostly_other_format
from minilmd.corpus.sources.longdoc import LineVerdict
from minilmd.corpus_meta import CorpusError
from minilmd.names import (
    DOC_LENGTHS,
    LEAK_KEYS,
    LONG_DOCUMENT_SPOOL,
    LOSS_MASK,
    SPLITS,
    TOKENS,
    UNCHECKED_VAL_MASK,
    UNCHECKED_VAL_TOKENS,
)
from minilmd.protocol import BOS_ID, EOS_ID

MAX_EXAMPLES = SHOWN  # bad lines and leaks listed by name in meta.json; all of them are counted


class SplitWriter:
    """tokens.bin (hashed as written) and the document lengths of one split; for a chat corpus also its loss mask
    (mask_path) and the per-conversation facts (analysis/stats.py FACTS)."""

    def __init__(self, path: Path, mask_path: Path | None = None):
        self.path = path
        self.file = open(path, "wb")
        self.sha = hashlib.sha256()
        self.lengths: list[np.ndarray] = []
        self.tokens = 0
        self.mask_path = mask_path
        self.mask_file = open(mask_path, "wb") if mask_path is not None else None
        self.facts: list[np.ndarray] = []

    def write(self, tokens: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None = None,
              facts: np.ndarray | None = None) -> None:
        data = tokens.data.cast("B") if tokens.size else b""
        self.file.write(data)
        self.sha.update(data)
        self.lengths.append(lengths)
        self.tokens += int(tokens.size)
        if self.mask_file is not None:
            assert mask is not None and facts is not None and mask.size == tokens.size  # a chat block's
            self.mask_file.write(mask.tobytes())
            self.facts.append(facts)

    def write_spooled(self, spool: Spool) -> None:
        """One long document: BOS, its ids from the spool (copied in bounded chunks), EOS."""
        self.write(np.array([BOS_ID], dtype="<u2"), np.array([spool.ids + 2], dtype=np.int32))
        for data in spool.read():
            self.file.write(data)
            self.sha.update(data)
        self.write(np.array([EOS_ID], dtype="<u2"), np.zeros(0, dtype=np.int32))
        self.tokens += spool.ids

    def close(self) -> None:
        for f in (self.file, self.mask_file):
            if f is not None:
                f.flush()
                os.fsync(f.fileno())
                f.close()

    def all_lengths(self) -> np.ndarray:
        return np.concatenate(self.lengths) if self.lengths else np.zeros(0, dtype=np.int32)

    def all_facts(self) -> np.ndarray:
        from minilmd.corpus.analysis.stats import FACTS

        return np.concatenate(self.facts) if self.facts else np.zeros((0, len(FACTS)), dtype=np.int64)


class Spool:
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
    scripts: np.ndarray | None = None  # its script_matrix row (scripts.py), summed over its pieces


class Collector:
    """Takes the encoded blocks in input order: writes the token streams and leak keys, and counts what meta.json
    reports (per source, bad lines, documents with special ids inside). It holds no source open: `paths` and `sizes`
    (source_list.source_sizes, every source checked and measured up front), then what each one read says of itself
    (read_through), as stream.py opens and reads them one at a time."""

    def __init__(self, tmp: Path, paths: list[str], sizes: list[int], on_bad_line: str, chat: bool = False):
        self.paths, self.on_bad_line = paths, on_bad_line
        self.json_arrays = [False] * len(paths)  # each source one JSON array, not JSON lines, once read (format_hint)
        self.chat = chat
        self.train = SplitWriter(tmp / SPLITS[0] / TOKENS, tmp / SPLITS[0] / LOSS_MASK if chat else None)
        self.val_raw = SplitWriter(tmp / SPLITS[1] / UNCHECKED_VAL_TOKENS,
                                   tmp / SPLITS[1] / UNCHECKED_VAL_MASK if chat else None)
        self.chat_counts: dict[str, int] = {}
        self.train_keys = open(tmp / SPLITS[0] / LEAK_KEYS, "wb")
        self.val_keys: list[np.ndarray] = []
        self.val_where: list[np.ndarray] = []  # (source index, line) of each val document, for the leak report
        self.bad = BadLines(tmp / SPOOL)  # every bad line, named (badlines.py)
        self.appending_to: tuple[str, str] | tuple[()] = ()  # an append's corpus and its format (format_hint)
        self.special_examples: list[str] = []
        self.ignored_examples: list[str] = []  # chat: `path:line: keys dropped`, the first MAX_EXAMPLES lines kept
        self.special_docs = 0
        self.text_bytes = 0
        self.train_min_digest = NO_DIGEST  # the train document closest to the val side of the split rule
        # per source; "dropped" too once --drop-scripts drops one
        self.sources: list[dict[str, Any]] = [{"path": path, "bytes": size, "lines": 0, "documents": 0,
                                               "blank_lines": 0, "bad_lines": 0}
                                              for path, size in zip(paths, sizes, strict=True)]
        from minilmd.corpus.analysis.scripts import ScriptTally

        self.scripts = ScriptTally()  # the kept documents of a text corpus, by script
        self.drop_scripts: frozenset[str] = frozenset()  # set by _encode_all: --drop-scripts
        self.spool = Spool(tmp / LONG_DOCUMENT_SPOOL)
        self.threshold = 0  # set by _encode_all: the split rule's

    def read_through(self, src_idx: int, src: Source) -> None:
        """What the source `src_idx` says of itself once read (`src`, opened for that read): its bytes as opened then
        and where its links led (the file read, named: the one link rule), whether it is one JSON array."""
        entry = self.sources[src_idx]
        entry["bytes"] = src.size
        if src.linked_to is not None:  # a link followed (the one link rule): the file read, named
            entry["real_path"] = src.linked_to
        else:
            entry.pop("real_path", None)
        self.json_arrays[src_idx] = src.json_array

    @property
    def documents(self) -> int:
        return sum(m["documents"] for m in self.sources)

    @property
    def tokens(self) -> int:
        return self.train.tokens + self.val_raw.tokens

    @property
    def bad_counts(self) -> dict[str, int]:
        return self.bad.counts

    @property
    def bad_examples(self) -> list[str]:
        return self.bad.first

    @property
    def failing(self) -> bool:
        """--on-bad-line error and a bad line seen: the rest is only read for its bad lines, nothing more is
        written (the run ends in exit 65 naming them all)."""
        return self.on_bad_line == "error" and self.bad.total > 0

    def check_bad_lines(self) -> None:
        """InputError naming every bad line under --on-bad-line error (call once the input is read and the list
        published: BadLines.publish)."""
        if self.failing:
            raise self.bad.error(self.format_hint())

    def format_hint(self) -> str:
        """Advice said once ("" for none): a source that is one JSON array, not JSON lines (most of its lines bad);
        most lines read another format's than the one prepared (line_shape.py: chat data given to a text corpus's
        reader, text to a chat corpus's, pairs to either, ...): the input is in another format, not thousands of
        lines to mend."""
        arrays = [s["path"] for array, s in zip(self.json_arrays, self.sources, strict=True)
                  if array and 2 * s["bad_lines"] > s["lines"] - s["blank_lines"]]
        read = sum(s["lines"] - s["blank_lines"] for s in self.sources)
        other = mostly_other_format(self.bad.counts, read)
        said = [json_document_advice(arrays)] if arrays else []
        if other:
            said.append(advice(other, *self.appending_to))
        return "\n".join(said)

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
        if self.failing:
            return
        self.sources[src_idx]["documents"] += int(block.train_lengths.size + block.val_lengths.size)
        if block.dropped:
            self._dropped(src_idx, block.dropped)
        if block.scripts is not None:
            self.scripts.merge(block.scripts)
        self.text_bytes += block.text_bytes
        self.train_min_digest = min(self.train_min_digest, block.train_min_digest)
        self._special(src_idx, block.special_inside)
        for name, n in (block.chat_counts or {}).items():
            self.chat_counts[name] = self.chat_counts.get(name, 0) + n
        if block.chat_counts:
            self.special_docs += block.chat_counts["special_text"]
        for line, what in (block.ignored_keys or [])[:MAX_EXAMPLES - len(self.ignored_examples)]:
            self.ignored_examples.append(f"{self.paths[src_idx]}:{line}: {what}")
        self.train.write(block.train_tokens, block.train_lengths, block.train_mask, block.train_facts)
        self.train_keys.write(block.train_keys.tobytes())
        self.val_raw.write(block.val_tokens, block.val_lengths, block.val_mask, block.val_facts)
        self.val_keys.append(block.val_keys)
        self.val_where.append(np.stack([np.full(block.val_lines.size, src_idx), block.val_lines], axis=1))

    def end_long(self, src_idx: int, end: LongEnd) -> None:
        """A long line has been read: a document (its ids are in the spool), a bad line or a blank one."""
        verdict = end.verdict
        bad = [(end.line, *verdict.bad)] if verdict.bad else []
        self._lines(src_idx, 1, int(verdict.blank), bad)
        if verdict.blank or verdict.bad or self.failing:
            self.spool.reset()
            return
        if end.scripts is not None:
            from minilmd.corpus.analysis.scripts import containing

            row = end.scripts.reshape(1, -1)
            if containing(row, self.drop_scripts)[0]:
                self._dropped(src_idx, 1)
                self.spool.reset()
                return
            self.scripts.add(row)
        if self.spool.ids + 2 > np.iinfo(np.int32).max:
            raise InputError(f"{self.paths[src_idx]}:{end.line}: a document of {self.spool.ids:,} tokens; "
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

    def _dropped(self, src_idx: int, n: int) -> None:
        sm = self.sources[src_idx]
        sm["dropped"] = sm.get("dropped", 0) + n

    def _lines(self, src_idx: int, n_lines: int, blank: int, bad: list) -> None:
        name = self.paths[src_idx]
        for line, reason, detail in bad:
            self.bad.add(name, line, reason, detail)
        sm = self.sources[src_idx]
        sm["lines"] += n_lines
        sm["blank_lines"] += blank
        sm["bad_lines"] += len(bad)

    def _special(self, src_idx: int, lines: list[int]) -> None:
        self.special_docs += len(lines)
        for line in lines[:MAX_EXAMPLES - len(self.special_examples)]:
            self.special_examples.append(f"{self.paths[src_idx]}:{line}")

    def close(self) -> None:
        self.train.close()
        self.val_raw.close()
        self.train_keys.close()
        self.spool.close()
        self.bad.close()


def leak_check(tmp: Path, found: Collector) -> tuple[np.ndarray, list[str]]:
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
    return leaked, [f"{found.paths[int(s)]}:{int(line)}" for s, line in vwhere[leaked][:MAX_EXAMPLES]]


def write_splits(tmp: Path, found: Collector, leaked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """val's tokens.bin (and loss_mask.bin) without its leaked documents, and both splits' doc_lengths.npy;
    returns the lengths."""
    val_lengths_all = found.val_raw.all_lengths().astype(np.int64)
    keep = ~leaked
    copy_kept(found.val_raw.path, val_lengths_all, keep, tmp / SPLITS[1] / TOKENS)
    found.val_raw.path.unlink()
    if found.val_raw.mask_path is not None:
        copy_kept(found.val_raw.mask_path, val_lengths_all, keep, tmp / SPLITS[1] / LOSS_MASK, itemsize=1)
        found.val_raw.mask_path.unlink()
    train_lengths = found.train.all_lengths()
    val_lengths = val_lengths_all[keep].astype(np.int32)
    np.save(tmp / SPLITS[0] / DOC_LENGTHS, train_lengths)
    np.save(tmp / SPLITS[1] / DOC_LENGTHS, val_lengths)
    return train_lengths, val_lengths


def copy_kept(src: Path, lengths: np.ndarray, keep: np.ndarray, dst: Path, chunk: int = 8 << 20,
               itemsize: int = 2) -> None:
    """dst = the documents of the token file src (itemsize bytes per token: 2 for ids, 1 for a loss mask) whose
    `keep` is set, copied run by run in bounded chunks."""
    bounds = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    edges = np.flatnonzero(np.diff(np.concatenate([[0], keep.astype(np.int8), [0]])))  # kept runs: [start, end)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        for first, last in edges.reshape(-1, 2):
            fin.seek(itemsize * int(bounds[first]))
            left = itemsize * int(bounds[last] - bounds[first])
            while left:
                data = fin.read(min(chunk, left))
                if not data:
                    raise CorpusError(f"{src}: ends {left} bytes early (written by this prepare a moment ago)")
                fout.write(data)
                left -= len(data)
