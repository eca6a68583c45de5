"""How many rows one epoch of the train split holds, and how many optimizer steps those rows make: the rules the
samplers (minilmd/plan/), the step budget (plan/budget.py) and prepare's figures (corpus/analysis/stats.py, kept in
meta.json) count by. In the core's base, below both the corpus tools and the plan, so that each calls these and none
keeps a copy (issue 43: prepare's report said 10 steps an epoch where the packed sampler takes 11)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from minilmd.config_sections import ONE_DOCUMENT_A_ROW


def packed_windows(n_tokens: int, seq_len: int) -> int:
    """Windows of one epoch of packed mode: as many as fit every epoch's offset (the sampler shifts the window
    edges by a random offset in [0, seq_len) each epoch: minilmd/plan/samplers.py)."""
    return max(0, (n_tokens - seq_len + 1) // seq_len)


def kind_of_rows(mode: str, doc_mask: bool, chat: bool) -> str:
    """What a row of `data.mode` is (plan/samplers.row_kind, which refuses the ""): "windows" (packed),
    "conversations" (packed with doc_mask on a chat corpus), "padded" or "bucketed" (one document per row); "" for a
    mode there is not."""
    if mode == "packed":
        return "conversations" if doc_mask and chat else "windows"
    return mode if mode in ONE_DOCUMENT_A_ROW else ""


def packed_too_small(n_tokens: int, seq_len: int) -> str:
    """Why a train split of `n_tokens` holds no packed window at `seq_len` ("" when it holds one): the sampler's
    refusal (minilmd/plan/samplers.py), the config check's (minilmd/probes.py) and prepare's warning."""
    if packed_windows(n_tokens, seq_len) > 0:
        return ""
    # packed_windows' first window: seq_len tokens at every offset in [0, seq_len), so 2 x seq_len - 1 in all
    return (f"the train split has {n_tokens:,} tokens; packed mode needs at least 2 x seq_len - 1 = "
            f"{2 * seq_len - 1:,} (lower train.seq_len or prepare a larger corpus)")


def too_few_rows(kind: str, *, items: int, tokens: int, seq_len: int, micro_batch_size: int, unit: str) -> str:
    """Why one epoch of a train split of `items` (documents, conversations or pairs: `unit`) and `tokens` holds no
    micro-batch of rows of `kind` (plan/samplers.row_kind), "" when it holds one: the samplers' refusal
    (minilmd/plan/) and the config check's (minilmd/probes.py: `run --check` and the launch), one rule. A bucket
    (bucketed, pairs) is one micro-batch of like length and an epoch leaves the last partial one out, so it needs
    train.micro_batch_size items; one document a row (padded) or packed conversations need one (a micro-batch larger
    than the epoch repeats its rows); packed windows, one window."""
    if kind == "windows":
        return packed_too_small(tokens, seq_len)
    if items <= 0:
        return f"the train split has no {unit}"
    if kind in ("bucketed", "pairs") and items < micro_batch_size:
        return (f"the train split has {items:,} {unit}, fewer than one micro-batch of train.micro_batch_size = "
                f"{micro_batch_size:,} (an epoch is whole micro-batches of {unit} of like length): set "
                f"train.micro_batch_size <= {items:,} (train.grad_accum keeps the global batch), or prepare a larger "
                f"corpus")
    return ""


def full_buckets(n_docs: int, bucket: int) -> int:
    """Rows of one epoch of bucketed mode: the documents of the full buckets (n_docs % bucket sit each epoch out)."""
    return n_docs - n_docs % bucket


def epoch_rows(kind: str, *, documents: int, tokens: int, seq_len: int, micro_batch_size: int) -> int:
    """Rows of one epoch for a row kind that meta.json's counts tell (plan/samplers.row_kind): "windows" (packed),
    "bucketed" (buckets of micro_batch_size), "padded" (one document a row) or "pairs" (a preference corpus's pairs,
in buckets). Padding-free SFT's "conversations"
    depend on every conversation's length: plan/epoch.py's epoch_of."""
    if kind == "windows":
        return packed_windows(tokens, seq_len)
    if kind == "bucketed":
        return full_buckets(documents, max(micro_batch_size, 1))
    if kind == "padded":
        return documents
    if kind == "pairs":  # a preference corpus: a row (item) is a pair of documents (minilmd/plan/pairs.py)
        return full_buckets(documents // 2, max(micro_batch_size, 1))
    raise ValueError(f"rows of {kind!r} are not counted from meta.json alone")


def steps_for_rows(rows: int, global_batch: int, epochs: float = 1) -> int:
    """Optimizer steps that `epochs` epochs of `rows` rows take at `global_batch` rows a step: the last step of a
    budget may reach into the next epoch (the samplers continue across epochs), so a started batch counts; 0 for
    no rows."""
    return max(1, math.ceil(epochs * rows / global_batch)) if rows and global_batch else 0


def pairs_past_cut(meta: dict, seq_len: int) -> tuple[dict[str, tuple[int, int]], bool]:
    """For each split of a preference corpus (its meta.json, read leniently: a value of another type counts as not
    there), (pairs whose final reply falls wholly past seq_len, pairs), and whether those counts are exact. A row
    keeps the first seq_len tokens of a side (plan/bucketing.py), so a pair trains at seq_len when the offset of
    its later side's first reply token is below it. Exact from `dpo.<split>.reply_starts` (prepare writes it: the
    pairs at each such offset, docs/formats.md); for a corpus prepared before, a lower bound from the prompt's
    length figures (min, median, p90, p99, max: at least the pairs ranked from that figure up)."""
    out, exact = {}, True
    for split in ("train", "val"):
        figures = _table(_table(meta.get("dpo")).get(split))
        n = figures.get("pairs")
        if not isinstance(n, int) or n <= 0:
            continue
        starts = figures.get("reply_starts")
        if isinstance(starts, list) and all(isinstance(e, list) and len(e) == 2 and all(isinstance(v, int)
                                                                                        for v in e) for e in starts):
            out[split] = (max(0, min(n, sum(pairs for start, pairs in starts if start >= seq_len))), n)
            continue
        exact = False
        prompt = _table(figures.get("prompt"))
        out[split] = (max([n - max(math.ceil(rank * n), 1) + 1 for key, rank in _RANKS.items()
                           if isinstance(prompt.get(key), int) and prompt[key] >= seq_len] + [0]), n)
    return out, exact


def pairs_fit(meta: dict, seq_len: int, counts: dict[str, tuple[int, int]] | None = None) -> tuple[str, str]:
    """(problem, warning) of a DPO run at train.seq_len = seq_len on this preference corpus: a problem (the run is
    refused, exit 2) when a split keeps a reply of none of its pairs or fewer than half of all pairs keep one, a
    warning when some do not; each names the pairs and the fix. `counts`: the exact ones the trainer counted from
    its rows (plan/pairs.py); without, pairs_past_cut's from meta.json."""
    counts, exact = (counts, True) if counts is not None else pairs_past_cut(meta, seq_len)
    if not any(lost for lost, _ in counts.values()):
        return "", ""
    at_least = "" if exact else "at least "
    which = ", ".join(f"{at_least}{lost:,} of {n:,} {split} pairs" for split, (lost, n) in counts.items() if lost)
    kept, total = sum(n - lost for lost, n in counts.values()), sum(n for _, n in counts.values())
    longest = max(_longest_prompts(meta) + [seq_len - 1])
    prepared_at = _table(meta.get("chat")).get("seq_len")
    fix = f"set train.seq_len >= {longest + 1} (each pair keeps a reply token" + (
        f"; {prepared_at}, the --seq-len it was prepared at, keeps them as prepared)"
        if isinstance(prepared_at, int) and prepared_at > longest + 1 else ")")
    said = (f"train.seq_len = {seq_len} cuts away the whole final reply of {which} (their prompts are {seq_len} "
            f"tokens or longer): DPO learns nothing from them, their loss a constant ln 2; {fix}, or prepare the "
            f"corpus again at --seq-len {seq_len}, which drops them")
    refused = past_half(total - kept, total) or any(lost == n for lost, n in counts.values())
    return (said, "") if refused else ("", said)


def past_half(lost: int, total: int) -> bool:
    """The line past which a cut at train.seq_len refuses a run (exit 2) rather than warns: more than half of what
    trains is lost (DPO: its pairs, pairs_fit; SFT: its train split's reply tokens, replies_fit)."""
    return 2 * lost > total


@dataclass(frozen=True)
class RepliesCut:
    """What train.seq_len cuts of one split of an SFT corpus (counted by minilmd/replycut.py): conversations left
    with no target in their row, of how many; targets past the rows, of how many. `sampled`: the long documents
    were a sample (the counts are scaled estimates)."""
    without_reply: int
    items: int
    targets_lost: int
    targets: int
    sampled: bool = False


def replies_fit(counts: dict[str, RepliesCut], seq_len: int, prepared_at: object) -> tuple[str, str]:
    """(problem, warning) of an SFT run whose rows keep a conversation's first seq_len tokens (replycut.py counts
    what that cuts per split): a problem (refused, exit 2) past half of the train split's reply tokens lost, a
    warning when any conversation of either split is left without a reply token or any reply token is cut; each
    names the counts and the fix. The train split alone decides the refusal: it is what the run learns from, whereas
    a cut val split only narrows what the val loss measures (and a val split with cuts and a train split without
    loses no training)."""
    train = counts.get("train")
    counts = {split: c for split, c in counts.items() if c.targets_lost or c.without_reply}
    if not counts:
        return "", ""
    about = "about " if any(c.sampled for c in counts.values()) else ""
    which = "; ".join(f"{split}: {about}{c.without_reply:,} of {c.items:,} conversations keep no reply token, "
                      f"{about}{c.targets_lost:,} of {c.targets:,} reply tokens cut "
                      f"({c.targets_lost / max(c.targets, 1):.0%})" for split, c in counts.items())
    higher = (f"raise train.seq_len to {prepared_at}, the --seq-len the corpus was prepared at"
              if isinstance(prepared_at, int) and prepared_at > seq_len else "raise train.seq_len")
    said = (f"train.seq_len = {seq_len} cuts each conversation's row at {seq_len} tokens ({which}): the cut replies "
            f"train nothing; {higher}, or prepare the corpus again at --seq-len {seq_len} (it drops the "
            f"conversations left without a reply and counts what it cuts)")
    return (said, "") if train is not None and past_half(train.targets_lost, train.targets) else ("", said)


_RANKS = {"min": 0.0, "median": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}
"""The rank of each prompt length figure (corpus/analysis/stats.py length_stats: the figure at q is the
max(ceil(q * n), 1)-th shortest), so that at least the pairs from that rank up are as long as it."""


def _longest_prompts(meta: dict) -> list[int]:
    """The longest prompt of each split (its figure `max`) and the furthest offset of a first reply token
    (`reply_starts`' last), as far as meta.json says them."""
    found = []
    for split in ("train", "val"):
        figures = _table(_table(meta.get("dpo")).get(split))
        found.append(_table(figures.get("prompt")).get("max"))
        starts = figures.get("reply_starts")
        found.append(starts[-1][0] if isinstance(starts, list) and starts and isinstance(starts[-1], list)
                     and starts[-1] else None)
    return [v for v in found if isinstance(v, int)]


def _table(value) -> dict:
    return value if isinstance(value, dict) else {}
