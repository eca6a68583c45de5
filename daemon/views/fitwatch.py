"""`minilmd status`'s view of fitting: train and val loss per epoch, and the signs of overfitting and forgetting.

Read from metrics.jsonl (the trainer's train, eval and early_stop lines, each with its epoch) and [eval] of the
run's config copy:
- per epoch: the mean train loss over its logged steps and their spread (min-max and standard deviation: the
  seed's "0.08 ~ 2.5 jumping" signature of a fine-tune overfitting), the last val loss, the probe loss;
- "val loss rising for N evals": the last eval.warn_rising validations each above the one before;
- "train/val gap > X": the last val loss above its epoch's mean train loss by more than eval.warn_gap (a DPO run
  whose config leaves it unset: DPO_WARN_GAP, its losses being on a smaller scale), and a sign
  of overfitting with it: the gap has grown by more than warn_gap since the first epoch that had one, or the val
  loss is above its lowest (by more than VAL_NOISE of it). A gap there from the start with a flat val loss is a
  difference between the train and val distributions (a LoRA run on a style corpus), not overfitting: no warning;
- "probe loss rising": the retention probe ([eval] probe) above its first value by more than the gap;
- a DPO run (its eval lines carry val_reward_accuracy): the last validation's rewards, and "DPO loss at ln 2" when
  the last LN2_EVALS val losses all lie within LN2_TOLERANCE of ln 2 = 0.6931, the loss of a policy equal to its
  reference: nothing is being learnt (the learning rate, beta or the data; MiniMind's lr 4e-8 does this);
- the early stop, and which checkpoint is BEST (the best of early_stop.metric: the val loss or the reward accuracy).
Torch-free and light, like the rest of the views.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

LN2_EVALS = 3
LN2_TOLERANCE = 1e-3
VAL_NOISE = 0.01
"""A val loss within 1 % above its lowest is flat: the validation windows are few, their loss moves that much."""
DPO_WARN_GAP = 0.1
"""The train/val gap warned of on a DPO run whose config leaves eval.warn_gap unset. A DPO loss starts at ln 2 = 0.69
(a next-token loss near 2 after SFT), so eval.warn_gap's 0.5 is most of it: an 8-epoch DPO run on the tests' pairs
that overfit (val loss 0.208 at epoch 1 rising to 0.279, val reward accuracy 0.92 -> 0.86) had gaps of 0.12 to 0.18
from epoch 2 on, never above 0.5. 0.1 is about the share of a DPO loss that 0.5 is of SFT's."""


@dataclass
class Epoch:
    epoch: int
    train: list[float]
    val: float | None = None
    probe: float | None = None

    @property
    def mean(self) -> float | None:
        return sum(self.train) / len(self.train) if self.train else None

    @property
    def std(self) -> float:
        m = self.mean
        return math.sqrt(sum((x - m) ** 2 for x in self.train) / len(self.train)) if self.train and m else 0.0


def read_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl's objects of the current lineage (after the last `run --fresh` start: daemon/base/timeline.py),
    of its last STATUS_METRICS_LINES lines and only from a regular file (daemon/views/curves.py read_recent: never a
    FIFO, a link to /dev/zero nor a file someone made huge read whole), as status reads them."""
    from minilmd.daemon.views.curves import read_timeline

    return read_timeline(run_dir, recent=True).records


def once_per_step(records: list[dict]) -> list[dict]:
    """The train and eval lines one per step, sorted by step, the last attempt's where a resume logged a step again
    (every attempt appends to metrics.jsonl: a run resumed from step 100 after dying at 130 has two lines for each
    of 101-130); the other lines (early_stop, checkpoint) as they were."""
    from minilmd.daemon.views.curves import last_per_step

    kept = [r for r in records if r.get("kind") not in ("train", "eval")]
    for kind in ("train", "eval"):
        kept += last_per_step([r for r in records if r.get("kind") == kind])
    return kept


def config_copy(run_dir: Path):
    """The run's config copy (a RunConfig), None where it cannot be read. Read as every reader reads it
    (minilmd/run_config_copy.py: the run's user's or ours, a FIFO, a link, a file too big or nested too deep
    refused, its values typed), never parsed here."""
    from minilmd.config import ConfigError
    from minilmd.run_config_copy import run_config_of

    try:
        return run_config_of(run_dir)
    except (ConfigError, OSError, ValueError):  # ValueError: init_place.Refused (a link, a FIFO, a third user's)
        return None


def warn_settings(run_dir: Path, dpo: bool = False, cfg=None) -> tuple[int, float, float]:
    """(eval.warn_rising, the train/val gap, the probe's rise) of the run's config copy (`cfg`, read here when not
    given), the defaults where it says nothing or cannot be read. eval.warn_gap bounds both; left unset on a DPO
    run, the train/val gap is DPO_WARN_GAP (a DPO loss starts at ln 2), while the probe, scored by its next-token
    loss on every run, keeps the usual default."""
    from minilmd.config import EvalSection

    cfg = cfg or config_copy(run_dir)
    if cfg is None:
        defaults = EvalSection()
        return defaults.warn_rising, DPO_WARN_GAP if dpo else defaults.warn_gap, defaults.warn_gap
    section = cfg.eval
    gap = DPO_WARN_GAP if dpo and not cfg.is_set("eval.warn_gap") else section.warn_gap
    return section.warn_rising, gap, section.warn_gap


def epochs(records: list[dict]) -> list[Epoch]:
    by_epoch: dict[int, Epoch] = {}
    for r in records:
        if "epoch" not in r or r.get("kind") not in ("train", "eval"):
            continue
        e = by_epoch.setdefault(int(r["epoch"]), Epoch(int(r["epoch"]), []))
        if r["kind"] == "train" and isinstance(r.get("loss"), (int, float)):
            e.train.append(float(r["loss"]))
        elif r["kind"] == "eval":
            e.val = r.get("val_loss", e.val)
            e.probe = r.get("probe_loss", e.probe)
    return [by_epoch[k] for k in sorted(by_epoch)]


def warnings(records: list[dict], warn_rising: int, warn_gap: float, probe_gap: float | None = None) -> list[str]:
    """The overfitting and forgetting warnings the records show now (see the module docstring); the probe's rise is
    bounded by probe_gap (warn_gap when None)."""
    out = []
    evals = [r for r in records if r.get("kind") == "eval" and isinstance(r.get("val_loss"), (int, float))]
    vals = [float(r["val_loss"]) for r in evals]
    rising = 0
    for before, after in zip(reversed(vals[:-1]), reversed(vals), strict=False):
        if after <= before:
            break
        rising += 1
    if rising >= warn_rising:
        out.append(f"val loss rising for {rising} evals ({vals[-rising - 1]:.4f} -> {vals[-1]:.4f} at step "
                   f"{evals[-1].get('step')})")
    gap = gap_warning(epochs(records), vals, warn_gap)
    if gap:
        out.append(gap)
    probes = [float(r["probe_loss"]) for r in evals if isinstance(r.get("probe_loss"), (int, float))]
    if len(probes) > 1 and probes[-1] - probes[0] > (warn_gap if probe_gap is None else probe_gap):
        out.append(f"probe loss rising: {probes[0]:.4f} -> {probes[-1]:.4f} (forgetting the earlier stage)")
    dpo = [float(r["val_loss"]) for r in evals if "val_reward_accuracy" in r]
    if len(dpo) >= LN2_EVALS and all(abs(v - math.log(2)) <= LN2_TOLERANCE for v in dpo[-LN2_EVALS:]):
        out.append(f"DPO loss at ln 2 (0.6931) for the last {LN2_EVALS} evals ({dpo[-1]:.4f} at step "
                   f"{evals[-1].get('step')}): nothing is being learnt; raise train.lr or dpo.beta, or check the "
                   "pairs")
    return out


def dpo_line(records: list[dict]) -> str | None:
    """The last DPO validation's rewards (TRL's names), or None for another run."""
    last = next((r for r in reversed(records) if r.get("kind") == "eval" and "val_reward_accuracy" in r), None)
    if last is None:
        return None
    try:
        return (f"  dpo: val reward accuracy {float(last['val_reward_accuracy']):.3f}, margin "
                f"{float(last['val_reward_margin']):.4f} (chosen {float(last['val_reward_chosen']):.4f}, rejected "
                f"{float(last['val_reward_rejected']):.4f}) at step {last.get('step')}")
    except (KeyError, TypeError, ValueError):
        return None  # a line of another minilmd, or damaged: nothing to say


def gap_warning(done: list[Epoch], vals: list[float], warn_gap: float) -> str | None:
    """The train/val gap warning (the module docstring), or None: a gap above warn_gap that grew since the first
    epoch with one, or with the val loss above its lowest."""
    gaps = [(e, e.val - e.mean) for e in done if e.val is not None and e.mean is not None]
    if not gaps or gaps[-1][1] <= warn_gap:
        return None
    (first, first_gap), (last, last_gap) = gaps[0], gaps[-1]
    best = min(vals) if vals else None
    if last_gap - first_gap > warn_gap:
        sign = f"grown from {first_gap:.3f} in epoch {first.epoch}"
    elif best is not None and vals[-1] > best + VAL_NOISE * abs(best):
        sign = f"val above its lowest, {best:.4f}"
    else:
        return None  # there from the start, val flat: the distributions differ; the model is not overfitting
    return (f"train/val gap {last_gap:.3f} > {warn_gap:g} in epoch {last.epoch} (train {last.mean:.4f}, val "
            f"{last.val:.4f}; {sign})")


def fit_lines(run_dir: str | Path, records: list[dict] | None = None) -> list[str]:
    """status's lines: one per epoch (the last 5), the warnings, the early stop; of `records` (the current lineage's
    metrics.jsonl objects) when status has read them already, else read here."""
    run_dir = Path(run_dir)
    records = once_per_step(read_metrics(run_dir) if records is None else records)
    done = epochs(records)
    if not done:
        return []
    lines = []
    for e in done[-5:]:
        parts = [f"  epoch {e.epoch}:"]
        if e.mean is not None:
            parts.append(f"train {e.mean:.4f} (per-batch {min(e.train):.3f}..{max(e.train):.3f}, std {e.std:.3f}, "
                         f"{len(e.train)} logs)")
        if e.val is not None:
            parts.append(f"val {e.val:.4f}")
        if e.probe is not None:
            parts.append(f"probe {e.probe:.4f}")
        lines.append("  ".join(parts))
    dpo = dpo_line(records)
    lines += [dpo] if dpo else []
    cfg = config_copy(run_dir)
    lines += [f"  WARNING: {w}" for w in warnings(records, *warn_settings(run_dir, dpo=dpo is not None, cfg=cfg))]
    stop = next((r for r in reversed(records) if r.get("kind") == "early_stop"), None)
    if stop:
        lines.append(early_stop_line(stop))
    elif cfg is not None and cfg.early_stop.patience > 0 and (best := best_line(records, cfg.early_stop.metric)):
        lines.append(best)
    return lines


def _best_words(metric: str, value, step) -> str:
    """`best val loss 0.5000 at step 12 (the checkpoint BEST names`: the one home of BEST's words here."""
    said = f"{value:.4f}" if isinstance(value, (int, float)) else "?"
    return f"best {metric.replace('_', ' ')} {said} at step {step} (the checkpoint BEST names"


def early_stop_line(stop: dict) -> str:
    """The early_stop line: the best of the metric it followed (early_stop.metric; the val loss before it existed)."""
    metric = str(stop.get("metric", "val_loss"))
    best = _best_words(metric, stop.get(f"best_{metric}"), stop.get("best_step"))
    return f"  early stop at step {stop.get('step')}: {best})"


def best_line(records: list[dict], metric: str) -> str | None:
    """BEST of a run with [early_stop] that did not stop early (it trained its budget, or trains still), when it
    names another step than the last validation's: a stage whose init.from names the run starts from BEST
    (init.checkpoint = "best", the default), which status would otherwise never name. The best is the trainer's
    own (the last eval line's `best_<metric>` and `best_step`, min_delta applied)."""
    evals = [r for r in records if r.get("kind") == "eval" and isinstance(r.get(metric), (int, float))]
    if not evals or not isinstance(best := evals[-1].get(f"best_{metric}"), (int, float)):
        return None
    step = _best_step(evals, metric, best)
    last = evals[-1].get("step")
    if step is None or step == last:
        return None
    return (f"  {_best_words(metric, best, step)}; a later stage's init.from takes it by default, not step "
            f"{last})")


def _best_step(evals: list[dict], metric: str, best: float) -> int | None:
    """The step of the best: the last eval line's `best_step`. A line written before eval lines carried it (until
    2026-12) names it only by its value: the first validation that scored it, which is wrong where a resume counted
    the best from nothing (another early_stop.metric before) and an earlier validation scored the same."""
    if "best_step" in evals[-1]:
        step = evals[-1]["best_step"]
        return step if isinstance(step, int) else None
    return next((r.get("step") for r in evals if round(float(r[metric]), 6) == best), None)
