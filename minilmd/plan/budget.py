"""How many steps a run's budget allows, and what they train: the rule the trainer runs by (`total_steps_for_budget`)
and the figures `run --check` (its budget line, `budget_line`; update_share.py) and `corpus report --config` print
from it (`planned`).

The config as the trainer will run it comes first: the defaults of the corpus's stage (minilmd/config.py,
stage_defaults: SFT's on a chat corpus, DPO's on a preference corpus), which the trainer applies once it has opened
the corpus, so a chat run is bucketed unless its config says otherwise; `lr_line` says the rate they give.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path

from minilmd.config import ConfigError, RunConfig, apply_stage_defaults, stage_defaults
from minilmd.config_values import derived_checks_wait, no_budget
from minilmd.corpus_meta import meta_value, read_corpus_meta
from minilmd.fmt import fmt_duration
from minilmd.plan.epoch import Epoch, corpus_epoch
from minilmd.plan.trainer_state import Trained
from minilmd.rowcount import steps_for_rows


def budget_steps(cfg: RunConfig, global_batch: int, rows_per_epoch: int | None = None,
                 done: Trained | None = None) -> dict[str, int]:
    """Each budget the config sets, in global steps, by its key: max_steps; max_tokens and max_epochs in what
    `done` (a resumed checkpoint's record: plan/trainer_state.py) has trained of them, then the rest at
    `global_batch` rows of seq_len tokens a step: its step + ceil((max_tokens - its token positions) / tokens per
    step), its step + (max_epochs x rows per epoch - its rows) / rows per step, a started step counted
    (rowcount.steps_for_rows), only when `rows_per_epoch` is known. Counted so, a resume with another micro-batch
    ends when the tokens or epochs are trained (before, the budget was turned into steps at today's batch and
    compared with the global step: a doubled micro-batch trained half the tokens still due, twice over). With the
    batch unchanged, the same steps as a fresh count."""
    t = cfg.train
    done = done or Trained(0, 0, 0)
    per_step = global_batch * t.seq_len
    budgets = {}
    if t.max_steps:
        budgets["train.max_steps"] = t.max_steps
    if t.max_tokens:  # all at today's batch: the fresh count, the very steps an undisturbed run trains
        budgets["train.max_tokens"] = math.ceil(t.max_tokens / per_step) if done.positions == done.step * per_step \
            else done.step + -(-max(0, t.max_tokens - done.positions) // per_step)
    if t.max_epochs and rows_per_epoch:
        budgets["train.max_epochs"] = (
            steps_for_rows(rows_per_epoch, global_batch, t.max_epochs) if done.rows == done.step * global_batch
            else done.step + max(0, math.ceil((t.max_epochs * rows_per_epoch - done.rows) / global_batch)))
    return budgets


def total_steps_for_budget(cfg: RunConfig, global_batch: int, rows_per_epoch: int | None = None,
                           done: Trained | None = None) -> int:
    """The steps the run trains: of its budgets (budget_steps, after what `done` trained), whichever ends first."""
    budgets = budget_steps(cfg, global_batch, rows_per_epoch, done)
    if not budgets:
        raise ConfigError(["a budget is required: set train.max_steps, train.max_tokens or train.max_epochs"],
                          cfg.source)
    return min(budgets.values())


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
    """What a run's budget trains: `steps` of `global_batch` rows of up to `seq_len` tokens, and the `epoch` they
    are cut from (None when the corpus does not tell, then an epoch budget cannot be counted), at the peak rate `lr`
    (as_trained's); `limits`: each budget set, in steps (budget_steps), the least of which is `steps`; `done`: what
    the checkpoint it resumes from trained (None: a fresh start, or one whose batch never changed, whose steps are
    all of `global_batch` rows)."""

    steps: int
    global_batch: int
    epoch: Epoch | None
    lr: float
    seq_len: int = 0
    limits: dict[str, int] = field(default_factory=dict)
    done: Trained | None = None

    @property
    def rows(self) -> int:
        if self.done is None:
            return self.steps * self.global_batch
        return self.done.rows + max(0, self.steps - self.done.step) * self.global_batch

    @property
    def positions(self) -> int:
        """The token positions the budget trains (train.max_tokens' count)."""
        if self.done is None:
            return self.rows * self.seq_len
        return self.done.positions + max(0, self.steps - self.done.step) * self.global_batch * self.seq_len

    @property
    def samples(self) -> int | None:
        """The sample updates: documents (conversations) trained, whatever a row holds."""
        return self.epoch.samples(self.rows) if self.epoch else None

    @property
    def epochs(self) -> float | None:
        return self.rows / self.epoch.rows if self.epoch and self.epoch.rows else None


@dataclass(frozen=True)
class Rate:
    """The speed a run directory's earlier launch measured (state.json's progress): `tok_s` real tokens a second
    (minilmd/metrics.py), its last step shown `step` (the heartbeat's when newer than its last train line), and
    `tokens_seen` real tokens (None: not recorded) after `seen_at` steps, both of one train line (None: `step`'s):
    a step's tokens are one line's pair, never a line's tokens over the heartbeat's step (a run at step 85 whose
    line of step 50 said its tokens was timed at 50/85 of its step). `at`: the step the launch starts from, where
    `run --check` knows it (the checkpoint it resumes, or 0); None: unknown, and `step`, the last known, is what the
    steps left are counted from, said so (a restart resumes from an older step where the newest was lost: user9 F11
    "the 147 steps left" of a run resuming 185 before its end)."""

    tok_s: float
    step: int = 0
    tokens_seen: int | None = None
    at: int | None = None
    seen_at: int | None = None

    @property
    def from_step(self) -> int:
        return self.step if self.at is None else self.at

    @property
    def tokens_a_step(self) -> float | None:
        """The real tokens a step trained, as the run counted them (tokens_seen over its own line's step); None when
        not recorded."""
        steps = self.step if self.seen_at is None else self.seen_at
        return self.tokens_seen / steps if self.tokens_seen and steps > 0 else None


def time_left(plan: Planned, rate: Rate) -> tuple[int, float] | None:
    """(Steps left from rate.from_step, their seconds) at `rate`, a step's tokens as that run trained them
    (Rate.tokens_a_step: real tokens, as tok_s counts; else the step's global_batch x seq_len), at today's batch
    where this resume changes it (plan.done: the share of real tokens the run had, of today's positions a step;
    before, the old step's tokens: a 64x micro-batch said 2 minutes for 18); None when no step is left."""
    left = plan.steps - rate.from_step
    if left <= 0:
        return None
    per_step = float(plan.global_batch * plan.seq_len)  # every position a real token: before a rate is known
    if (real := rate.tokens_a_step) is not None:
        done = plan.done
        if done is None or not done.step or not done.positions:
            per_step = real  # the batch is the one the rate was measured at
        else:  # its share of real tokens, of today's positions a step
            per_step *= min(1.0, real * done.step / done.positions)
    return left, left * per_step / rate.tok_s


def budget_line(cfg: RunConfig, plan: Planned | None, rate: Rate | None = None) -> str:
    """What `run --check` says of the budget: its steps, rows and tokens, the epochs of train they are, which
    budget binds when several are set (and what each other would be), and the time they take at a rate this run
    directory measured before (none before a run has: no figure is guessed)."""
    t = cfg.train
    if plan is None:
        return (f"budget: train.max_epochs = {t.max_epochs:g} of {cfg.data.prepared}, whose size is not readable "
                f"here: the trainer counts the steps once the corpus is staged")
    kind = plan.epoch.kind if plan.epoch else "windows"  # rows of documents count their padding; a pair, each side
    rows, positions = {"windows": ("rows", "tokens"), "pairs": ("pairs", "token positions a side")}.get(
        kind, ("rows", "token positions"))
    if plan.done is None:
        line = (f"budget: {plan.steps:,} steps x {plan.global_batch:,} {rows} x {plan.seq_len:,} tokens = "
                f"{_count(plan.positions)} {positions}")
    else:  # a resume whose batch changed: what its checkpoint trained, then the rest at today's batch
        line = (f"budget: {plan.steps:,} steps: the {plan.done.step:,} trained ({plan.done.rows:,} {rows}, "
                f"{_count(plan.done.positions)} {positions}), then {max(0, plan.steps - plan.done.step):,} x "
                f"{plan.global_batch:,} {rows} x {plan.seq_len:,} tokens = {_count(plan.positions)} {positions}")
    if plan.epochs is not None:
        line += f" = {plan.epochs:,.2f} epochs of train"
    binds = next(key for key, steps in plan.limits.items() if steps == plan.steps)
    others = [f"{setting_words(cfg, key)} would be {steps:,} steps" for key, steps in plan.limits.items()
              if key != binds]
    if t.max_epochs and "train.max_epochs" not in plan.limits:
        others.append(f"{setting_words(cfg, 'train.max_epochs')} is not counted: the corpus's size is not readable "
                      f"here")
    line += f" ({binds} binds; {'; '.join(others)})" if others else f" ({setting_words(cfg, binds)})"
    if rate is None:
        return line + "; no time estimate before a launch has measured this run's speed (status gives its ETA)"
    if (left := time_left(plan, rate)) is None:
        return line + "; none of it is left"
    done = "all of it" if rate.from_step <= 0 else f"the {left[0]:,} steps left" if rate.at is not None else \
        f"the {left[0]:,} steps left after step {rate.step:,} (the last known: where the launch resumes is not known)"
    return line + f"; {done} take about {fmt_duration(left[1])} at the {rate.tok_s:,.0f} tok/s this run last measured"


def setting_words(cfg: RunConfig, key: str) -> str:
    value = getattr(cfg.train, key.split(".")[1])
    return f"{key} = {value:g}" if isinstance(value, float) else f"{key} = {value:,}"


def _count(n: int) -> str:
    """A token count as a person reads it: 39.3 M, 1.25 B, or in full below a million."""
    if n >= 10**9:
        return f"{n / 1e9:,.2f} B"
    return f"{n / 1e6:.1f} M" if n >= 10**6 else f"{n:,}"


def epoch_without_budget(cfg: RunConfig) -> list[str]:
    """With no budget set, what one epoch of the corpus would be in this run's steps, counted as the trainer counts
    (`planned` at train.max_epochs = 1): a line beside config_values' missing-budget message, whose core cannot
    count a data mode's rows. [] with a budget, or when the corpus does not tell. An ExtraCheck (load_checked's
    more_checks) of `run --check`, the supervisor and `minilmd train`; it waits while a field it reads is not usable
    (config_values.derived_checks_wait)."""
    if not no_budget(cfg) or not cfg.data.prepared or derived_checks_wait(cfg):
        return []
    one = copy.deepcopy(cfg)
    one.train.max_epochs = 1.0
    plan = planned(one)
    if plan is None or plan.epoch is None or not plan.epoch.rows:
        return []
    return [f"without a budget: one epoch of {cfg.data.prepared} is {plan.steps:,} steps of {plan.global_batch:,} "
            f"rows ({plan.epoch.rows:,} rows, each {plan.epoch.row_holds()})"]


def planned(cfg: RunConfig, meta: dict | None = None, prepared: str | Path | None = None,
            done: Trained | None = None) -> Planned | None:
    """The run's plan as the trainer will count it (RunConfig.world_size ranks), or None when its budget
    cannot be told (an epoch budget on a corpus that does not say its size). `meta`: the corpus's meta.json (None:
    read from data.prepared); `prepared`: where the corpus is (default data.prepared); `done`: what the checkpoint
    the launch resumes from trained (plan/trainer_state.py trained), which the trainer counts the budget after."""
    meta = read_corpus_meta(cfg.data.prepared) if meta is None else meta
    cfg = as_trained(cfg, meta)
    global_batch = cfg.train.global_batch(cfg.world_size)
    epoch = corpus_epoch(cfg, meta, prepared)
    limits = budget_steps(cfg, global_batch, epoch.rows if epoch else None, done)
    if not limits:
        return None
    changed = done is not None and (done.rows != done.step * global_batch or
                                    done.positions != done.rows * cfg.train.seq_len)
    return Planned(min(limits.values()), global_batch, epoch, cfg.train.lr, cfg.train.seq_len, limits,
                   done if changed else None)
