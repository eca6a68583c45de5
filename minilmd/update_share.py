"""`minilmd run --check`: the share of sample updates a fine-tune takes relative to the run it starts from.

The seed's style SFT (section 3): 87,940 conversations x 5 epochs = 439,700 sample updates on top of a base SFT of
1,809,958, i.e. 24 % of the updates, on a very different distribution at an unchanged learning rate: the textbook
setting of catastrophic forgetting. Here: this run's planned rows (its budget: max_steps x global batch,
max_tokens / seq_len, max_epochs x rows per epoch of its corpus; whichever ends first) against the rows the base
checkpoint's run trained on (`rows_seen` in its trainer_state.json), a warning above eval.update_share_warn.
Torch-free.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from minilmd.config import RunConfig
from minilmd.corpus.meta import meta_value, read_corpus_meta
from minilmd.init_source import InitSourceError, resolve
from minilmd.names import TRAINER_STATE


def rows_per_epoch(cfg: RunConfig) -> int | None:
    """Windows (packed) or documents (padded, bucketed) of the train split, from a local corpus's meta.json."""
    split = meta_value(read_corpus_meta(cfg.data.prepared) or {}, "splits", "train") or {}
    if cfg.data.mode == "packed":
        return split["tokens"] // cfg.train.seq_len if isinstance(split.get("tokens"), int) else None
    return split.get("documents") if isinstance(split.get("documents"), int) else None


def planned_rows(cfg: RunConfig) -> int | None:
    """The rows (sample updates) this run's budget trains on, or None when it cannot be told."""
    t = cfg.train
    batch = t.micro_batch_size * t.grad_accum * max(cfg.gpu.count, 1)
    budgets = []
    if t.max_steps:
        budgets.append(t.max_steps * batch)
    if t.max_tokens:
        budgets.append(math.ceil(t.max_tokens / (batch * t.seq_len)) * batch)
    per_epoch = rows_per_epoch(cfg)
    if t.max_epochs and per_epoch:
        budgets.append(max(1, math.ceil(t.max_epochs * per_epoch / batch)) * batch)
    return min(budgets) if budgets else None


def base_rows(cfg: RunConfig) -> tuple[Path, int] | None:
    """(the base checkpoint, the rows its run trained on), for an init.from that is a minilmd checkpoint."""
    try:
        source = resolve(cfg.init.from_, cfg.init.checkpoint)
        state = json.loads((source.path / TRAINER_STATE).read_text(encoding="utf-8"))
    except (InitSourceError, OSError, ValueError):
        return None
    rows = state.get("rows_seen")
    return (source.path, rows) if source.kind == "checkpoint" and isinstance(rows, int) and rows > 0 else None


def share_lines(cfg: RunConfig) -> list[str]:
    """What `run --check` prints about the update share (nothing without init.from or without the numbers)."""
    if not cfg.init.from_:
        return []
    base, planned = base_rows(cfg), planned_rows(cfg)
    if base is None or planned is None:
        return []
    path, rows = base
    share = planned / rows
    line = (f"update share: this run trains {planned:,} sample updates, {100 * share:.1f} % of the {rows:,} of its "
            f"base {path}")
    if share > cfg.eval.update_share_warn:
        return [f"WARNING: {line}, above eval.update_share_warn = {cfg.eval.update_share_warn:g}: a fine-tune this "
                f"large on other data at this learning rate erases what the base learnt (the seed's style SFT took "
                f"24 %); lower train.lr or the epochs, use [lora], or watch [eval] probe"]
    return [line]
