"""`minilmd corpus count PATTERN ... CORPUS`: how often each pattern occurs, and in how many documents.

The cleaning gate of the seed (count the residual self-attribution phrases after cleaning, expect zero) on a
multi-GB corpus: the corpus is read once, in parallel over shards (minilmd/corpus/analysis/scan.py), every pattern
counted
in every document. A literal pattern counts non-overlapping occurrences (str.count); with --regex each pattern is
a Python regular expression and counts its non-overlapping matches (re.finditer). A prepared corpus is counted in
its documents decoded by its own tokenizer (scan.py; a chat corpus in its messages' content: the replies under the
loss mask and the user turns, not the template's role names); JSONL in each line's text.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

import numpy as np

from minilmd.corpus.analysis import scan


@dataclass
class CountTask:
    """Occurrences and documents of each pattern over the batches of one shard."""
    patterns: list[str]
    regex: bool = False
    examples: int = 3
    occurrences: list[int] = field(default_factory=list)
    documents: list[int] = field(default_factory=list)
    seen: int = 0
    read: scan.LinesRead = field(default_factory=scan.LinesRead)
    first: list[list[str]] = field(default_factory=list)  # a few matched snippets per pattern

    def fresh(self) -> CountTask:
        return CountTask(self.patterns, self.regex, self.examples)

    def add(self, batch: scan.Batch) -> None:
        if not self.occurrences:
            n = len(self.patterns)
            self.occurrences, self.documents, self.first = [0] * n, [0] * n, [[] for _ in range(n)]
        self.seen += len(batch.texts)
        self.read.add(batch)
        compiled = [re.compile(p) for p in self.patterns] if self.regex else None
        for i, pattern in enumerate(self.patterns):
            occ = docs = 0
            for text in batch.texts:
                if compiled is not None:
                    hits = [m.group(0) for m in compiled[i].finditer(text)]
                    k = len(hits)
                else:
                    k = text.count(pattern)
                    hits = [pattern] if k else []
                if k:
                    occ += k
                    docs += 1
                    if len(self.first[i]) < self.examples:
                        at = text.find(hits[0])
                        self.first[i].append(text[max(at - 20, 0):at + len(hits[0]) + 20].replace("\n", " "))
            self.occurrences[i] += occ
            self.documents[i] += docs

    def result(self) -> CountTask:
        return self


def count(path: str, patterns: list[str], regex: bool = False, workers: int | None = None) -> dict:
    """{"corpus", "kind", "documents", "bad_lines", "too_long_lines" (of them, over jsonl.MAX_LINE_BYTES),
    "too_long_named", "patterns": [{pattern, occurrences, documents, examples}]};
    ValueError for a regex that does not compile (before any reading)."""
    from minilmd.corpus.workers import default_workers

    if regex:
        for p in patterns:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"--regex: {p!r} is not a valid regular expression ({e})") from None
    workers = default_workers() if workers is None else workers
    corpus = scan.open_corpus(scan.user_path(path), max(workers, 1) * 4)
    parts = scan.run(corpus, CountTask(list(patterns), regex), workers)
    n = len(patterns)
    occ, docs = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    examples: list[list[str]] = [[] for _ in range(n)]
    for part in parts:
        if part.occurrences:
            occ += part.occurrences
            docs += part.documents
            for i in range(n):
                examples[i] += part.first[i][:3 - len(examples[i])]
    too_long = scan.too_long_named(corpus.path, [p.read for p in parts])
    return {"corpus": path, "kind": corpus.kind, "documents": sum(p.seen for p in parts),
            "bad_lines": sum(p.read.bad for p in parts), "too_long_lines": too_long.total,
            "too_long_named": too_long.named(),
            "patterns": [{"pattern": p, "occurrences": int(occ[i]), "documents": int(docs[i]),
                          "examples": examples[i]} for i, p in enumerate(patterns)]}


def format_count(result: dict) -> str:
    """The table `minilmd corpus count` prints."""
    n = result["documents"]
    width = max([len("pattern")] + [display_width(p["pattern"]) for p in result["patterns"]])
    bad = f", {result['bad_lines']:,} bad lines not read{scan.too_long_said(result)}" if result["bad_lines"] else ""
    lines = [f"{result['corpus']} ({result['kind']}): {n:,} documents{bad}",
             *(f"  {named}" for named in result.get("too_long_named", [])),
             f"{_pad('pattern', width)}  {'occurrences':>12}  {'documents':>10}  {'share':>8}"]
    for p in result["patterns"]:
        share = p["documents"] / n if n else 0.0
        lines.append(f"{_pad(p['pattern'], width)}  {p['occurrences']:>12,}  {p['documents']:>10,}  {share:>8.4%}")
    for p in result["patterns"]:
        for ex in p["examples"]:
            lines.append(f"  {p['pattern']}: ...{ex}...")
    return "\n".join(lines)


def display_width(text: str) -> int:
    """The columns a terminal gives `text`: two for a wide or full-width character (CJK), none for a combining
    mark, one for the rest; str.ljust counts characters, and misaligned the table for CJK patterns."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - display_width(text))
