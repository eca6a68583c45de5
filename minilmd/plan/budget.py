"""How many steps a run's budget allows, and what they train: the rule the trainer runs by (`total_steps_for_budget`)
and the figures `run --check` (update_share.py) and `corpus report --config` print from it (`planned`).

The config as the trainer will run it comes first: the defaults of the corpus's stage (minilmd/config.py,
stage_defaults: SFT's on a chat corpus, DPO's on a preference corpus), which the trainer applies once it has opened
the corpus, so a chat run is bucketed unless its config says otherwise; `lr_line` says the rate they give.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

from minilmd.config import ConfigError, RunConfig, apply_stage_defaults, stage_defaults
from minilmd.config_values import no_budget
from minilmd.corpus_meta import meta_value, read_corpus_meta
from minilmd.plan.epoch import Epoch, corpus_epoch
from minilmd.rowcount import steps_for_rows


def total_steps_for_budget(cfg: RunConfig, global_batch: int, rows_per_epoch: int | None = None) -> int:
    """max_steps, ceil(max_tokens / tokens per step), ceil(max_epochs * rows per epoch / rows per step); with
    several, whichever ends first."""
    t = cfg.train
    budgets = []
    if t.max_steps:
        budgets.append(t.max_steps)
    if t.max_tokens:
        budgets.append(math.ceil(t.max_tokens / (global_batch * t.seq_len)))
    if t.max_epochs and rows_per_epoch:
        budgets.append(steps_for_rows(rows_per_epoch, global_batch, t.max_epochs))
    if not budgets:
        raise ConfigError(["a budget is required: set train.max_steps, train.max_tokens or train.max_epochs"],
                          cfg.source)
    return min(budgets)


def as_trained(cfg: RunConfig, meta: dict | None = None) -> RunConfig:
    """The config as the trainer will run it: with its corpus's stage defaults applied (apply_stage_defaults). A
    copy: `cfg` is left as it is. `meta`: the corpus's meta.json (None: read from data.prepared)."""
    meta = read_corpus_meta(cfg.data.prepared) if meta is None else meta
    trained = copy.deepcopy(cfg)
    apply_stage_defaults(trained, _data_format(meta))
    return trained


def _data_format(meta: dict | None) -> str:
    return str(meta_value(meta or {}, "data_format") or "text")


def lr_line(cfg: RunConfig, meta: dict | None = None) -> str:
    """What `run --check` says of the peak learning rate the trainer will run a fresh start at (as_trained's) and
    where it comes from; a WARNING for 0, a sanity run whose weights do not move."""
    meta = read_corpus_meta(cfg.data.prepared) if meta is None else meta
    t = as_trained(cfg, meta).train
    if t.lr == 0:
        return ("WARNING: train.lr = 0: a sanity run, the weights will not move (the loss stays where it starts; a "
                "DPO run's at ln 2, and status says so)")
    stage, defaults = stage_defaults(_data_format(meta), cfg.lora.enabled)
    if cfg.is_set("train.lr"):
        why = "set in the config"
    elif meta is None:  # a remote corpus, or one not there yet: the trainer applies its stage's default at start
        why = "default of a text corpus; a chat or preference corpus's stage, not readable here, has its own"
    elif "train.lr" in defaults:
        why = f"{stage} default; set train.lr to change"
    else:
        why = "default; set train.lr to change"
    return (f"lr {t.lr:g} ({why}), cosine down to {t.lr * t.min_lr_ratio:g}; a resumed run keeps the rate its "
            f"checkpoints record unless train.lr is set")


@dataclass(frozen=True)
class Planned:
    """What a run's budget trains: `steps` of `global_batch` rows, and the `epoch` they are cut from (None when the
    corpus does not tell, then an epoch budget cannot be counted), at the peak rate `lr` (as_trained's)."""

    steps: int
    global_batch: int
    epoch: Epoch | None
    lr: float

    @property
    def rows(self) -> int:
        return self.steps * self.global_batch

    @property
    def samples(self) -> int | None:
        """The sample updates: documents (conversations) trained, whatever a row holds."""
        return self.epoch.samples(self.rows) if self.epoch else None

    @property
    def epochs(self) -> float | None:
        return self.rows / self.epoch.rows if self.epoch and self.epoch.rows else None


def epoch_without_budget(cfg: RunConfig) -> list[str]:
    """With no budget set, what one epoch of the corpus would be in this run's steps, counted as the trainer counts
    (`planned` at train.max_epochs = 1): a line beside config_values' missing-budget message, whose core cannot
    count a data mode's rows. [] with a budget, or when the corpus does not tell. An ExtraCheck (load_checked's
    more_checks) of `run --check`, the supervisor and `minilmd train`."""
    if not no_budget(cfg) or not cfg.data.prepared:
        return []
    one = copy.deepcopy(cfg)
    one.train.max_epochs = 1.0
    plan = planned(one)
    if plan is None or plan.epoch is None or not plan.epoch.rows:
        return []
    return [f"without a budget: one epoch of {cfg.data.prepared} is {plan.steps:,} steps of {plan.global_batch:,} "
            f"rows ({plan.epoch.rows:,} rows, each {plan.epoch.row_holds()})"]


def planned(cfg: RunConfig, meta: dict | None = None, prepared: str | Path | None = None) -> Planned | None:
    """The run's plan as the trainer will count it (RunConfig.world_size ranks), or None when its budget
    cannot be told (an epoch budget on a corpus that does not say its size). `meta`: the corpus's meta.json (None:
    read from data.prepared); `prepared`: where the corpus is (default data.prepared)."""
    meta = read_corpus_meta(cfg.data.prepared) if meta is None else meta
    cfg = as_trained(cfg, meta)
    global_batch = cfg.train.global_batch(cfg.world_size)
    epoch = corpus_epoch(cfg, meta, prepared)
    try:
        steps = total_steps_for_budget(cfg, global_batch, epoch.rows if epoch else None)
    except ConfigError:
        return None
    return Planned(steps, global_batch, epoch, cfg.train.lr)
