"""`minilmd run --check`: the share of sample updates a fine-tune takes relative to the run it starts from.

The seed's style SFT (section 3): 87,940 conversations x 5 epochs = 439,700 sample updates on top of a base SFT of
1,809,958, i.e. 24 % of the updates, on a very different distribution at an unchanged learning rate: the textbook
setting of catastrophic forgetting. Here: the rows (sample updates) this run's budget trains on, counted as the
trainer will count them (the SFT defaults applied first on a chat corpus, so a chat run is bucketed unless its
config says otherwise; packed: windows of seq_len; padded: one document per row; bucketed: one document per row, the
last partial bucket of micro_batch_size left out), against the rows the base checkpoint's run trained on (`rows_seen`
in its trainer_state.json: what it did train, not what it planned), a warning above eval.update_share_warn.
Torch-free.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

from minilmd.config import RunConfig, apply_sft_defaults
from minilmd.corpus.meta import meta_value, read_corpus_meta
from minilmd.init_source import InitSourceError, resolve
from minilmd.names import TRAINER_STATE
from minilmd.untrusted import read_json

TRAINER_STATE_MAX_BYTES = 16 << 20


def as_trained(cfg: RunConfig, meta: dict | None = None) -> RunConfig:
    """The config as the trainer will run it: on a chat corpus with the SFT defaults (minilmd/config.py) applied,
    as the trainer applies them once it has opened the corpus. A copy: `cfg` is left as it is. `meta`: the
    corpus's meta.json (None: read from data.prepared)."""
    meta = read_corpus_meta(cfg.data.prepared) if meta is None else meta
    if meta_value(meta or {}, "data_format") != "chat":
        return cfg
    trained = copy.deepcopy(cfg)
    apply_sft_defaults(trained)
    return trained


def rows_per_epoch(cfg: RunConfig, meta: dict | None = None) -> int | None:
    """Rows of one epoch of the train split, from a local corpus's meta.json (or `meta`), as the trainer's samplers
    count them (minilmd/plan: `items_per_epoch`). `cfg` as trained (as_trained)."""
    meta = read_corpus_meta(cfg.data.prepared) if meta is None else meta
    split = meta_value(meta or {}, "splits", "train") or {}
    if cfg.data.mode == "packed":
        tokens, seq_len = split.get("tokens"), cfg.train.seq_len
        return max(0, (tokens - seq_len + 1) // seq_len) if isinstance(tokens, int) else None
    documents = split.get("documents")
    if not isinstance(documents, int):
        return None
    if cfg.data.mode == "bucketed":
        return documents - documents % max(cfg.train.micro_batch_size, 1)
    return documents


def planned_rows(cfg: RunConfig, meta: dict | None = None) -> int | None:
    """The rows (sample updates) this run's budget trains on, or None when it cannot be told: its steps (the
    trainer's total_steps_for_budget: whichever budget ends first) times its global batch. `meta`: the corpus's
    meta.json (None: read from data.prepared)."""
    cfg = as_trained(cfg, meta)
    t = cfg.train
    batch = t.micro_batch_size * t.grad_accum * max(cfg.gpu.count, 1)
    steps = []
    if t.max_steps:
        steps.append(t.max_steps)
    if t.max_tokens:
        steps.append(math.ceil(t.max_tokens / (batch * t.seq_len)))
    per_epoch = rows_per_epoch(cfg, meta)
    if t.max_epochs and per_epoch:
        steps.append(max(1, math.ceil(t.max_epochs * per_epoch / batch)))
    return min(steps) * batch if steps else None


def base_rows(cfg: RunConfig) -> tuple[Path, int] | None:
    """(the base checkpoint, the rows its run trained on), for an init.from that is a minilmd checkpoint: its
    `rows_seen` (the rows up to that checkpoint), or for a checkpoint older than that field its step times its
    global batch (as a resume reads it: trainer/loop/resume.py)."""
    try:
        source = resolve(cfg.init.from_, cfg.init.checkpoint)
        state = read_json(source.path / TRAINER_STATE, max_bytes=TRAINER_STATE_MAX_BYTES, expect=None)
    except (InitSourceError, ValueError):  # Unreadable too: another user's checkpoint, read as hostile
        return None
    if source.kind != "checkpoint" or not isinstance(state, dict):
        return None
    rows = state.get("rows_seen")
    if not isinstance(rows, int):
        step, batch = state.get("step"), state.get("global_batch")
        rows = step * batch if isinstance(step, int) and isinstance(batch, int) else None
    return (source.path, rows) if isinstance(rows, int) and rows > 0 else None


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
    if share <= cfg.eval.update_share_warn:
        return [line]
    head = f"WARNING: {line}, above eval.update_share_warn = {cfg.eval.update_share_warn:g}: "
    if cfg.lora.enabled:  # already the remedy: the base stays as it is, but the model with the adapter on drifts
        return [head + "the base's weights stay frozen, but with the adapter on, this many updates on other data "
                "at this learning rate override what the base learnt (the seed's style SFT took 24 %); lower "
                "train.lr, the epochs or lora.rank, or watch [eval] probe"]
    return [head + "a fine-tune this large on other data at this learning rate erases what the base learnt (the "
            "seed's style SFT took 24 %); lower train.lr or the epochs, use [lora], or watch [eval] probe"]
