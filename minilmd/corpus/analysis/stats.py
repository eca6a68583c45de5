"""What padding and packing cost on a given corpus, from its document lengths alone.

Lengths count a document's BOS and EOS, as doc_lengths.npy does. For a sequence length T and a batch size B:
- MiniMind-style padding: one document per row, body truncated to T - 2, then `[BOS] body [EOS]` right-padded
  with PAD to T. Row d keeps min(L_d, T) tokens; the rest of the row is PAD (compute spent on nothing) and
  max(L_d - T, 0) tokens are dropped forever.
- Packing: the stream cut into windows of exactly T tokens across document boundaries: no PAD, nothing dropped,
  but a token whose window began inside an earlier document can attend to that document. Counted for windows
  aligned at multiples of T: in document d starting at offset s, the first min(L_d, T - s % T) tokens see a
  previous document when s % T != 0.
Steps per epoch are the trainer's count at B rows a step (one GPU, no accumulation): the rows of an epoch as its
sampler cuts them and the steps they make, both by minilmd/rowcount.py's rules (packed: the windows that fit every
epoch's offset; bucketed: the full buckets of B; a started last batch is a step).
- Bucketed (chat corpora; the trainer's data.mode "bucketed"): documents sorted by length and cut into
  micro-batches of B, each padded to the width class of its longest row (`width_class`, the trainer's own
  rounding): `bucketed_pad_share`. Batch order and the order of equal lengths do not change it.
Percentiles use the "lower" definition: the smallest length with at least q of the documents at or below it.
"""
from __future__ import annotations

import math

import numpy as np

from minilmd.rowcount import epoch_rows, packed_windows, steps_for_rows

FACTS = ("messages", "assistant_turns", "target_tokens", "cut")
"""The columns of the per-conversation facts array (int64) that travel with each split's documents: prepare's chat
workers write them (prepare/chat_encode.py), chat_split_stats reads them."""


def length_stats(lengths: np.ndarray) -> dict:
    lengths = np.asarray(lengths, dtype=np.int64)
    n = int(lengths.size)
    if n == 0:
        return {"documents": 0, "tokens": 0, "mean": 0.0, "median": 0, "p90": 0, "p99": 0, "max": 0, "min": 0}
    ranked = np.sort(lengths)  # memory per document, not per token (a histogram would be as long as the longest)

    def pct(q: float) -> int:
        return int(ranked[max(math.ceil(q * n), 1) - 1])

    return {
        "documents": n,
        "tokens": int(lengths.sum()),
        "mean": round(float(lengths.mean()), 2),
        "median": pct(0.5),
        "p90": pct(0.9),
        "p99": pct(0.99),
        "max": int(lengths.max()),
        "min": int(lengths.min()),
    }


def layout_stats(lengths: np.ndarray, seq_len: int, batch_size: int) -> dict:
    """The padding and packing figures for one (seq_len, batch_size); shares are fractions in [0, 1]."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n, tokens = int(lengths.size), int(lengths.sum())
    kept = np.minimum(lengths, seq_len)
    starts = np.cumsum(lengths) - lengths
    offset = starts % seq_len
    seeing = np.where(offset != 0, np.minimum(lengths, seq_len - offset), 0)
    windows = packed_windows(tokens, seq_len)
    return {
        "seq_len": seq_len,
        "batch_size": batch_size,
        "padded": {
            "pad_share": float(1 - kept.sum() / (n * seq_len)) if n else 0.0,
            "truncated_share": float((lengths - kept).sum() / tokens) if tokens else 0.0,
            "truncated_documents": int((lengths > seq_len).sum()),
            "steps_per_epoch": steps_per_epoch("padded", n, tokens, seq_len, batch_size),
        },
        "packed": {
            "windows": windows,
            "cross_document_share": float(seeing.sum() / tokens) if tokens else 0.0,
            "steps_per_epoch": steps_per_epoch("windows", n, tokens, seq_len, batch_size),
        },
    }


def steps_per_epoch(kind: str, documents: int, tokens: int, seq_len: int, batch_size: int) -> int:
    """Optimizer steps of one epoch in a data mode's rows (rowcount.epoch_rows' kinds) at batch_size rows a step."""
    rows = epoch_rows(kind, documents=documents, tokens=tokens, seq_len=seq_len, micro_batch_size=batch_size)
    return steps_for_rows(rows, batch_size)


def split_stats(lengths: np.ndarray, seq_len: int, batch_size: int) -> dict:
    return {"lengths": length_stats(lengths), **layout_stats(lengths, seq_len, batch_size)}


def format_report(name: str, stats: dict) -> str:
    """The human summary printed by `minilmd prepare`."""
    ln, pad, pack = stats["lengths"], stats["padded"], stats["packed"]
    T, B = stats["seq_len"], stats["batch_size"]
    return "\n".join([
        f"{name}: {ln['documents']:,} documents, {ln['tokens']:,} tokens; document length (with BOS/EOS) "
        f"mean {ln['mean']:.1f}, median {ln['median']}, p90 {ln['p90']}, p99 {ln['p99']}, max {ln['max']:,}",
        f"  at seq_len {T}, batch {B}:",
        f"  padded, one document per row (MiniMind): {pad['pad_share']:.1%} of compute spent on PAD, "
        f"{pad['truncated_share']:.1%} of tokens dropped by truncation ({pad['truncated_documents']:,} documents "
        f"cut), {pad['steps_per_epoch']:,} steps per epoch",
        f"  packed windows: no PAD, nothing dropped, {pack['cross_document_share']:.1%} of tokens can see a "
        f"previous document, {pack['steps_per_epoch']:,} steps per epoch ({pack['windows']:,} windows)",
    ])


WIDTH_CLASSES = 32
"""At most this many widths of bucketed micro-batches per seq_len (width_class)."""


def width_step(seq_len: int) -> int:
    """The spacing of the width classes: seq_len / WIDTH_CLASSES rounded up to a multiple of 8 (at least 8; 24
    at seq_len 768)."""
    return max(8, -(-seq_len // (WIDTH_CLASSES * 8)) * 8)


def width_classes(widths: np.ndarray, seq_len: int) -> np.ndarray:
    """Each width rounded up to its width class: the next multiple of width_step(seq_len), capped at seq_len.

    Why round: a bucketed micro-batch padded to its own longest row has one of hundreds of widths, and each new
    width is a new shape for torch.compile; rounded, a run has at most WIDTH_CLASSES shapes, each announced by a
    "compiling" heartbeat the first time it comes (trainer/loop/warmup.py). The price is the PAD of the rounding,
    about step / 2 per row (+4 % PAD at seq_len 768 on MiniMind-like lengths; multiples of 64 would cost +11 %)."""
    step = width_step(seq_len)
    return np.minimum(-(-np.asarray(widths, dtype=np.int64) // step) * step, seq_len)


def width_class(width: int, seq_len: int) -> int:
    """width_classes of one width."""
    return int(width_classes(np.asarray([width]), seq_len)[0])


def bucketed_pad_share(lengths: np.ndarray, batch_size: int, seq_len: int) -> float:
    """The PAD share of length-bucketed batches as the trainer builds them: lengths sorted, cut into micro-batches
    of batch_size (the last may be smaller), each padded to the width class of its own longest row."""
    ranked = np.sort(np.asarray(lengths, dtype=np.int64))
    n = int(ranked.size)
    if n == 0:
        return 0.0
    firsts = np.arange(0, n, batch_size)
    lasts = np.minimum(firsts + batch_size, n)
    padded = int((width_classes(ranked[lasts - 1], seq_len) * (lasts - firsts)).sum())
    return float(1 - ranked.sum() / padded)


def chat_split_stats(lengths: np.ndarray, facts: np.ndarray, seq_len: int, batch_size: int) -> dict:
    """A chat split's figures: conversations, turns, tokens, targets, lengths, cuts, and the PAD share of static
    padding to seq_len against length-bucketed micro-batches of batch_size (lengths are after the cut, <= seq_len).
    facts: the per-conversation columns of FACTS."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n, tokens = int(lengths.size), int(lengths.sum())
    col = {name: facts[:, i] for i, name in enumerate(FACTS)}
    targets = int(col["target_tokens"].sum())
    return {
        "conversations": n,
        "turns": int(col["messages"].sum()),
        "assistant_turns": int(col["assistant_turns"].sum()),
        "tokens": tokens,
        "target_tokens": targets,
        "target_share": targets / tokens if tokens else 0.0,
        "cut": int(col["cut"].sum()),
        "lengths": length_stats(lengths),
        "seq_len": seq_len,
        "batch_size": batch_size,
        "padded": {"pad_share": float(1 - tokens / (n * seq_len)) if n else 0.0,
                   "steps_per_epoch": steps_per_epoch("padded", n, tokens, seq_len, batch_size)},
        "bucketed": {"pad_share": bucketed_pad_share(lengths, batch_size, seq_len),
                     "steps_per_epoch": steps_per_epoch("bucketed", n, tokens, seq_len, batch_size)},
    }


def format_chat_report(name: str, stats: dict) -> str:
    """The human summary of a chat split printed by `minilmd prepare --format chat`."""
    ln, T, B = stats["lengths"], stats["seq_len"], stats["batch_size"]
    pad, bucket = stats["padded"]["pad_share"], stats["bucketed"]["pad_share"]
    limit = (1 - bucket) / (1 - pad) if pad < 1 else float("nan")
    return "\n".join([
        f"{name}: {stats['conversations']:,} conversations, {stats['turns']:,} turns ({stats['assistant_turns']:,} "
        f"replies), {stats['tokens']:,} tokens of which {stats['target_tokens']:,} targets "
        f"({stats['target_share']:.1%}); {stats['cut']:,} cut at seq_len {T}",
        f"  conversation length mean {ln['mean']:.1f}, median {ln['median']}, p90 {ln['p90']}, p99 {ln['p99']}, "
        f"max {ln['max']:,}",
        f"  at micro-batch {B}: static padding to {T}: {pad:.1%} PAD; length-bucketed batches: {bucket:.1%} PAD "
        f"(real tokens per row token {limit:.2f}x static's)",
    ])
