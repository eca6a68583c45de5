"""`minilmd corpus report PREPARED_OR_JSONL`: what a corpus holds, before training on it or cleaning it.

Documents and tokens (a prepared corpus, or JSONL with --tokenizer; JSONL alone is measured in characters), length
percentiles, the share of documents by script (minilmd/corpus/analysis/scripts.py: by dominant script and by "contains
any"), exact duplicates (the same blake2b-64 digest: of a line's text, or of a prepared document's token ids), and for a
model (--config or --params) its tokens per parameter against Chinchilla's ~20 and the epochs its budget implies.
The corpus is read once, in parallel (minilmd/corpus/analysis/scan.py); memory: 16 bytes per document (digest and
length).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from minilmd.corpus.analysis import scan
from minilmd.corpus.analysis.scripts import SCRIPTS, ScriptTally, script_matrix

CHINCHILLA_TOKENS_PER_PARAM = 20
"""Hoffmann et al. 2022: compute-optimal training uses about 20 tokens per parameter."""
PERCENTILES = (50, 90, 99)


@dataclass
class ReportTask:
    """One shard's digests, lengths, script tally and line counts; with tokenizer_json, JSONL texts are encoded
    and their lengths are tokens (with BOS and EOS, as prepare would store them)."""
    tokenizer_json: str | None = None
    digests: list[np.ndarray] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)
    scripts: ScriptTally = field(default_factory=ScriptTally)
    read: scan.LinesRead = field(default_factory=scan.LinesRead)
    _tok: object = None

    def fresh(self) -> ReportTask:
        return ReportTask(self.tokenizer_json)

    def add(self, batch: scan.Batch) -> None:
        lengths = batch.lengths
        if self.tokenizer_json is not None:
            if self._tok is None:
                from tokenizers import Tokenizer

                self._tok = Tokenizer.from_str(self.tokenizer_json)
            encs = self._tok.encode_batch_fast(batch.texts, add_special_tokens=False)  # type: ignore[attr-defined]
            lengths = np.array([len(e) + 2 for e in encs], dtype=np.int64)
        self.digests.append(batch.digests)
        self.lengths.append(lengths)
        self.scripts.add(script_matrix(batch.texts))
        self.read.add(batch)

    def result(self) -> ReportTask:
        self._tok = None  # a Tokenizer is not sent back
        return self


def refuse_chat_jsonl(path: str) -> None:
    """A chat JSONL reported against a model's budget (--params, --config): its lines as text are not what a run
    trains on, the prepared corpus is; ValueError naming `prepare`."""
    from minilmd.corpus.chat import starts_as_chat

    if os.path.isfile(path) and starts_as_chat(path):
        raise ValueError(f"{path} holds chat conversations (or preference pairs): a run trains on what `minilmd "
                         f"prepare {path} --format chat --tokenizer TOKENIZER --out DIR` (--format dpo for pairs) "
                         "makes of them (rendered by the "
                         "template, cut at seq_len), not on its lines as text; prepare it first, then "
                         "`minilmd corpus report DIR` counts its conversations and tokens for the budget")


def report(path: str, *, tokenizer: str | None = None, workers: int | None = None) -> dict:
    """The report as a dict (`minilmd corpus report --json` prints it); a model's budget against it (--params,
    --config) is minilmd/plan/model_budget.py's, which the command adds as "model"."""
    from minilmd.corpus.workers import default_workers

    workers = default_workers() if workers is None else workers
    corpus = scan.open_corpus(scan.user_path(path), max(workers, 1) * 4)
    tok_json = None
    if tokenizer and corpus.kind == "jsonl":
        from pathlib import Path

        from minilmd.corpus.tokenizer import read_tokenizer_text, tokenizer_from_text
        from minilmd.names import CORPUS_TOKENIZER

        tp = Path(tokenizer) / CORPUS_TOKENIZER if Path(tokenizer).is_dir() else Path(tokenizer)
        tok_json = read_tokenizer_text(tp)  # read once: the text checked is the text the workers use
        tokenizer_from_text(tok_json, str(tp))
    parts = scan.run(corpus, ReportTask(tok_json), workers)
    digests = np.concatenate([d for p in parts for d in p.digests] or [np.zeros(0, np.uint64)])
    lengths = np.concatenate([x for p in parts for x in p.lengths] or [np.zeros(0, np.int64)])
    tally = ScriptTally()
    for p in parts:
        tally.merge(p.scripts)
    unit = "tokens" if corpus.kind == "prepared" or tok_json else "characters"
    too_long = scan.too_long_named(corpus.path, [p.read for p in parts])
    out: dict = {"corpus": path, "kind": corpus.kind, "documents": int(lengths.size), "length_unit": unit,
                 unit: int(lengths.sum()), "bad_lines": sum(p.read.bad for p in parts),
                 "blank_lines": sum(p.read.blank for p in parts), "too_long_lines": too_long.total,
                 "too_long_named": too_long.named(), "lengths": length_stats(lengths),
                 "scripts": tally.as_dict(), "duplicates": duplicate_stats(digests)}
    if corpus.meta is not None:
        meta = corpus.meta
        out["data_format"] = meta.get("data_format", "text")
        out["splits"] = {s: meta["splits"][s] for s in ("train", "val")}
        out["train_tokens"] = int(meta["splits"]["train"]["tokens"])
        if out["data_format"] == "dpo":  # two documents a pair: chosen, rejected
            out["pairs"] = {s: int(meta["splits"][s].get("pairs", 0)) for s in ("train", "val")}
        if "dropped_scripts" in meta:
            out["dropped_scripts"] = meta["dropped_scripts"]
    elif unit == "tokens":
        out["train_tokens"] = out["tokens"]  # before the split: the whole corpus
    return out


def length_stats(lengths: np.ndarray) -> dict:
    if not lengths.size:
        return {}
    pct = np.percentile(lengths, PERCENTILES)
    return {"min": int(lengths.min()), "mean": round(float(lengths.mean()), 1),
            **{f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)}, "max": int(lengths.max())}


def duplicate_stats(digests: np.ndarray) -> dict:
    """Exact duplicates: copies beyond the first of each text, and how many distinct texts have copies."""
    if not digests.size:
        return {"copies": 0, "distinct_repeated": 0, "largest_group": 0}
    _, counts = np.unique(digests, return_counts=True)
    return {"copies": int((counts - 1).sum()), "distinct_repeated": int((counts > 1).sum()),
            "largest_group": int(counts.max())}


def _n(x: float) -> str:
    """1234567 -> 1.23M."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:g}"


def format_report(r: dict, short: bool = False) -> str:
    """The text `minilmd corpus report` prints; `short`: the lines prepare prints at its end."""
    unit = r["length_unit"]
    n = r["documents"]
    lines = [] if short else [f"corpus report: {r['corpus']} ({r['kind']}"
                              + (f", {r['data_format']}" if "data_format" in r else "") + ")"]
    head = f"documents {n:,}, {unit} {r[unit]:,}"
    if "splits" in r:
        head += (f" (train {r['splits']['train']['documents']:,} / {r['splits']['train']['tokens']:,}, "
                 f"val {r['splits']['val']['documents']:,} / {r['splits']['val']['tokens']:,})")
    lines.append(head)
    if "pairs" in r:
        lines.append(f"preference pairs: train {r['pairs']['train']:,}, val {r['pairs']['val']:,} (documents 2i and "
                     "2i+1 of a split: pair i's chosen and rejected sides)")
    if r["bad_lines"] or r["blank_lines"]:
        lines.append(f"lines not read: {r['bad_lines']:,} bad{scan.too_long_said(r)}, {r['blank_lines']:,} blank")
        lines += [f"  {named}" for named in r.get("too_long_named", [])]
    ls = r["lengths"]
    if ls:
        lines.append(f"length ({unit}): min {ls['min']:,} mean {ls['mean']:,} "
                     + " ".join(f"p{p} {ls[f'p{p}']:,.0f}" for p in PERCENTILES) + f" max {ls['max']:,}")
    sc = r["scripts"]
    if n:
        dom = ", ".join(f"{s} {c / n:.2%} ({c:,})" for s, c in sc["dominant"].items())
        lines.append(f"scripts, documents by dominant script: {dom}")
        if not short:
            anyof = ", ".join(f"{s} {sc['contains'].get(s, 0) / n:.2%}" for s in SCRIPTS if s in sc["contains"])
            lines.append(f"scripts, documents containing any: {anyof}")
    d = r["duplicates"]
    lines.append(f"duplicates (exact): {d['copies']:,} documents ({d['copies'] / n if n else 0:.2%}) repeat an "
                 f"earlier one; {d['distinct_repeated']:,} distinct texts have copies, the largest group "
                 f"{d['largest_group']:,}")
    if r.get("dropped_scripts", {}).get("scripts"):
        ds = r["dropped_scripts"]
        lines.append(f"dropped by --drop-scripts {','.join(ds['scripts'])}: {ds['documents']:,} documents")
    if "model" in r:
        m = r["model"]
        line = (f"model {_n(m['parameters'])} parameters: Chinchilla ~{CHINCHILLA_TOKENS_PER_PARAM} "
                f"tokens/parameter = {_n(m['chinchilla_tokens'])} tokens")
        if "tokens_per_parameter" in m:
            line += (f"; this corpus trains on {_n(r['train_tokens'])} = {m['tokens_per_parameter']:.3g} "
                     f"tokens/parameter ({m['of_chinchilla']:.1%} of it)")
        lines.append(line)
        if "budget_tokens" in m:
            rows = (f" ({m['rows']:,} rows of {m['rows_per_epoch']:,} an epoch, each {m['row_holds']}: "
                    f"{m['samples']:,} {m['unit']})" if "rows_per_epoch" in m else "")
            lines.append(f"budget {_n(m['budget_tokens'])} tokens{rows}" +
                         (f" = {m['epochs']:.3g} epochs of train" if "epochs" in m else ""))
    elif unit == "characters" and not short:
        lines.append("(lengths in characters: pass --tokenizer to count tokens and compare with a model)")
    return "\n".join(lines)


# --- the short form prepare computes as it goes and prints at its end ----------------------------------------------
def check_line_counts(found, documents_per_line: int = 1) -> None:
    """The seed's habit, asserted on every prepare: lines read = documents + blank + bad + dropped (by
    --drop-scripts, or a chat corpus's --on-long drop and conversations without a target; a preference corpus
    writes 2 documents per line). RuntimeError: a line was lost or counted twice, a bug, never bad input."""
    lines = sum(s["lines"] for s in found.sources)
    docs = sum(s["documents"] for s in found.sources) // documents_per_line
    blank = sum(s["blank_lines"] for s in found.sources)
    bad = sum(s["bad_lines"] for s in found.sources)
    dropped = sum(s.get("dropped", 0) for s in found.sources)
    dropped += sum(found.chat_counts.get(k, 0) for k in ("dropped_long", "dropped_no_target"))
    if lines != docs + blank + bad + dropped:
        raise RuntimeError(f"prepare read {lines:,} lines but counted {docs:,} documents + {blank:,} blank + "
                           f"{bad:,} bad + {dropped:,} dropped = {docs + blank + bad + dropped:,}")


def duplicates_of(tmp, found, documents_per_key: int = 1) -> dict:
    """Duplicates among the documents by their leak keys (the text with whitespace removed): train's from its key
    file (still there before the leak check), val's from memory. 8 bytes per document. A preference corpus's two
    documents of a pair share one key (documents_per_key 2): its duplicates are pairs, counted once a pair."""
    from minilmd.names import LEAK_KEYS, SPLITS

    train = np.fromfile(tmp / SPLITS[0] / LEAK_KEYS, dtype=np.uint64)
    return duplicate_stats(np.concatenate([train, *found.val_keys])[::documents_per_key])


def add_report_meta(meta: dict, found, duplicates: dict, train_lengths: np.ndarray, val_lengths: np.ndarray,
                    drop_scripts: frozenset[str]) -> None:
    """meta.json's stats.lengths, stats.duplicates, and for a text corpus stats.scripts and dropped_scripts."""
    stats = meta["stats"]
    stats["lengths"] = length_stats(np.concatenate([train_lengths, val_lengths]).astype(np.int64))
    stats["duplicates"] = {**duplicates, "key": "the leak key: exact after removing all whitespace"}
    if not found.chat:
        stats["scripts"] = found.scripts.as_dict()
        meta["dropped_scripts"] = {"scripts": sorted(drop_scripts),
                                   "documents": sum(s.get("dropped", 0) for s in found.sources)}


def prepare_summary(meta: dict) -> list[str]:
    """The report's short form from a fresh meta.json (no second pass over the data)."""
    stats = meta["stats"]
    n = sum(meta["splits"][s]["documents"] for s in ("train", "val"))
    lines = []
    ls = stats.get("lengths")
    if ls:
        lines.append(f"length (tokens, both splits): min {ls['min']:,} mean {ls['mean']:,} "
                     + " ".join(f"p{p} {ls[f'p{p}']:,.0f}" for p in PERCENTILES) + f" max {ls['max']:,}")
    sc = stats.get("scripts")
    if sc and sc["documents"]:
        k = sc["documents"]
        lines.append("scripts, documents by dominant script: "
                     + ", ".join(f"{s} {c / k:.2%}" for s, c in sc["dominant"].items()))
    d = stats.get("duplicates")
    if d:
        lines.append(f"duplicates (whitespace ignored): {d['copies']:,} documents ({d['copies'] / n if n else 0:.2%})"
                     f" repeat an earlier one")
    ds = meta.get("dropped_scripts")
    if ds and ds["scripts"]:
        lines.append(f"dropped by --drop-scripts {','.join(ds['scripts'])}: {ds['documents']:,} documents")
    return lines
