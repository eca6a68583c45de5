"""What a resume does to the learning rate: the rate of the step it resumes at under the schedule its checkpoint
ran by, against the one the resumed run will take, for `run --check` to say (daemon/jobs/resumefrom.py).

The schedule is a pure function of the step and the budget's total steps (plan/schedule.py lr_at), so raising the
budget of a run, or changing its batch under a budget in tokens or epochs, recomputes the cosine over the new total:
a run that had annealed to its floor (lr x min_lr_ratio at its last step) jumps back up the curve (user report 9,
finding 4: `train.max_steps` 200 -> 400 took step 200 from 5e-05 back to 2.6e-04, half the peak). minilmd has no
setting that keeps the old curve's tail; a constant rate is had with train.lr = the rate wanted and
train.min_lr_ratio = 1 (every step after the warmup at train.lr). Torch-free.
"""
from __future__ import annotations

import copy

from minilmd.batch_stream import TRAINED
from minilmd.config import RunConfig, keep_recorded_schedule
from minilmd.plan.budget import as_trained, planned
from minilmd.plan.schedule import lr_at
from minilmd.plan.trainer_state import Trained


def rate_change(cfg: RunConfig, recorded, done: Trained | None, meta: dict | None) -> str:
    """"lr at step S: OLD (...) -> NEW (...)" when the rate of the resumed step under the checkpoint's schedule
    (`recorded`: its batch_stream.stream_record, the total steps its trainer_state records) differs from the one
    this config gives it (the budget counted after `done`, as the trainer counts it; a rate the config leaves to a
    default kept from the checkpoint); "" when they agree, or when the checkpoint or the corpus does not say."""
    then = _then(recorded)
    if then is None or done is None or meta is None:  # meta: read by the caller, bounded (shared storage)
        return ""
    total_then, lr, ratio, warmup = then
    plan = planned(cfg, meta, None, done)
    if plan is None:
        return ""
    now = copy.deepcopy(as_trained(cfg, meta))
    keep_recorded_schedule(now, recorded)  # after the stage's defaults, as the trainer applies them
    t, step = now.train, done.step
    before = lr_at(step, total_then, lr, ratio, warmup)
    after = lr_at(step, plan.steps, t.lr, t.min_lr_ratio, t.warmup_steps)
    if f"{before:.3g}" == f"{after:.3g}":
        return ""
    floor = before <= lr * ratio * (1 + 1e-9)
    line = (f"lr at step {step:,}: {before:.3g} (its checkpoint's schedule over {total_then:,} steps) -> {after:.3g} "
            f"(over {plan.steps:,} steps now): the cosine is recomputed over the new total")
    if after > before:
        line += (", so the rate climbs back up" + (" from its floor" if floor else "") +
                 f"; to go on at {before:.3g} instead, set train.lr = {before:.3g} and train.min_lr_ratio = 1 (a "
                 f"constant rate: minilmd has no setting that keeps the old curve's tail)")
    return line


def _then(recorded) -> tuple[int, float, float, int] | None:
    """(total steps, lr, min_lr_ratio, warmup_steps) of the schedule the checkpoint ran by; None when it does not
    record them all."""
    if not isinstance(recorded, dict):
        return None
    raw, train = recorded.get(TRAINED), recorded.get("train")
    total = raw.get("total_steps") if isinstance(raw, dict) else None
    values = [train.get(k) for k in ("lr", "min_lr_ratio", "warmup_steps")] if isinstance(train, dict) else []
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0 or len(numbers) != 3:
        return None
    return total, float(numbers[0]), float(numbers[1]), int(numbers[2])
