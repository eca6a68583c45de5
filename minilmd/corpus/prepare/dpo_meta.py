"""A preference corpus's own part of meta.json (`prepare --format dpo`, dpo_encode.py) and of prepare's report: the
pairs per split, the lengths of their prompts and of the chosen and rejected replies, what was cut and dropped.

The pair layout (docs/formats.md): in each split, documents 2i and 2i + 1 are pair i's chosen and rejected sides;
the loss mask of a side covers its final reply, and the tokens before that reply are its prompt (the same on both
sides, up to a cut at seq_len)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from minilmd.corpus.analysis.stats import length_stats
from minilmd.names import LOSS_MASK, SPLITS

_DOCS = 1 << 15
"""Documents read at a time (each at most seq_len mask bytes: bounded temporaries)."""


def reply_starts(mask: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The offset of each document's first target token (its final reply), from the split's loss mask."""
    bounds = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    starts = np.empty(lengths.size, dtype=np.int64)
    for lo in range(0, lengths.size, _DOCS):
        hi = min(lo + _DOCS, lengths.size)
        block = np.asarray(mask[bounds[lo]:bounds[hi]])
        at = np.flatnonzero(block) + bounds[lo]
        doc = np.searchsorted(bounds, at, side="right") - 1
        first = np.unique(doc, return_index=True)
        starts[first[0]] = at[first[1]] - bounds[first[0]]
    return starts


def pair_figures(mask: np.ndarray, lengths: np.ndarray) -> dict:
    """The figures of one split: pairs, the pairs at each offset of their later side's first reply token
    (`reply_starts`: what a train.seq_len keeps of them, rowcount.pairs_past_cut), and the length statistics of
    prompts and chosen and rejected replies."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = reply_starts(mask, lengths) if lengths.size else np.zeros(0, dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    replies = _replies(mask, bounds)
    later, counts = np.unique(np.maximum(starts[0::2], starts[1::2]), return_counts=True)
    return {
        "pairs": int(lengths.size // 2),
        "reply_starts": [[int(s), int(c)] for s, c in zip(later, counts, strict=True)],
        "prompt": length_stats(starts[0::2]),
        "chosen_reply": length_stats(replies[0::2]),
        "rejected_reply": length_stats(replies[1::2]),
    }


def _replies(mask: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """The target tokens of each document."""
    out = np.zeros(bounds.size - 1, dtype=np.int64)
    for lo in range(0, out.size, _DOCS):
        hi = min(lo + _DOCS, out.size)
        block = np.asarray(mask[bounds[lo]:bounds[hi]], dtype=np.int64)
        if block.size:  # every document holds at least 2 tokens: the offsets strictly increase
            out[lo:hi] = np.add.reduceat(block, bounds[lo:hi] - bounds[lo])
    return out


def add_pair_meta(meta: dict, tmp: Path, lengths: dict[str, np.ndarray], counts: dict[str, int]) -> None:
    """meta.json's `dpo`: per split the pairs and their lengths; the pairs cut and dropped (counts: the
    encoders' chat counts, which a preference corpus counts in pairs)."""
    figures = {}
    for split in SPLITS:
        n = int(lengths[split].sum())
        mask = np.memmap(tmp / split / LOSS_MASK, dtype=np.uint8, mode="r", shape=(n,)) if n else np.zeros(0, np.uint8)
        figures[split] = pair_figures(mask, lengths[split])
        meta["splits"][split]["pairs"] = figures[split]["pairs"]
    meta["dpo"] = {
        **figures,
        "layout": "documents 2i and 2i+1 of a split are pair i's chosen and rejected sides",
        "pairs_cut": counts.get("cut", 0),
        "pairs_dropped_long": counts.get("dropped_long", 0),
        "pairs_dropped_no_target": counts.get("dropped_no_target", 0),
        "target_rule": "the final assistant reply of each side only (the prompt is shared)",
    }


def report_pairs(meta: dict) -> list[str]:
    """prepare's lines about the pairs."""
    d = meta["dpo"]
    lines = []
    for split in SPLITS:
        f = d[split]
        p, c, r = f["prompt"], f["chosen_reply"], f["rejected_reply"]
        lines.append(f"{split}: {f['pairs']:,} pairs; prompt tokens mean {p['mean']:.1f}, median {p['median']}, max "
                     f"{p['max']}; chosen reply mean {c['mean']:.1f}, max {c['max']}; rejected reply mean "
                     f"{r['mean']:.1f}, max {r['max']}")
    lines.append(f"pairs: {d['pairs_cut']:,} cut at seq_len {meta['chat']['seq_len']}, "
                 f"{d['pairs_dropped_long']:,} dropped as longer than it, {d['pairs_dropped_no_target']:,} dropped "
                 "as their final reply fell past the cut")
    return lines
