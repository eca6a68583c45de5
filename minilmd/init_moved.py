"""A finished stage whose init.from run has trained on since: `run --check` and the launch say "run is done" of the
stage (daemon/jobs/rundone.py), and this note says that its base has moved on, so that re-running a pipeline after
extending an earlier stage does not leave the later stages silently fine-tunes of the old model (user report 9,
finding 5). A note only: the stage is what it was, a fine-tune of the step it started from. And a run with checkpoints
whose config's init.from now names another source than the one it started from (an edit, a --set): a full
fine-tune skips [init] once it has checkpoints of its own (docs/training.md), and `names_another` says so at `run
--check` and the launch rather than resume silently; a LoRA run's checkpoints hold adapters alone, trained on the
base its init.from gave, so `lora_base_refused` refuses the edit (exit 2) at `run --check`, at the launch and in
staging alike (daemon/jobs/resumefrom.py, daemon/jobs/lorabase.py refuse_another_base): staged, the new base would
replace the copy in scratch that the adapters were trained on, the only one without a run.remote.
Torch-free.
"""
from __future__ import annotations

import os

from minilmd.config import RunConfig
from minilmd.untrusted import printable


def names_another(cfg: RunConfig, init_record, step: int | None) -> str:
    """"init.from now names X; this run started from Y (step N) and resumes its own checkpoints ..." when the
    config's init.from differs from what the resumed checkpoint (at `step`) records it started from (its
    trainer_state "init": "from", the config's value then, and the "step" it took); "" when they agree, when the
    config names none, or when nothing is resumed. Not for a LoRA run, which reads its base at every start: its
    edit is `lora_base_refused`'s."""
    now = cfg.init.from_
    if not now or step is None or cfg.lora.enabled:
        return ""
    record = init_record if isinstance(init_record, dict) else {}
    then, then_step = record.get("from"), record.get("step")
    if isinstance(then, str) and then and os.path.normpath(then) == os.path.normpath(now):
        return ""
    if isinstance(then, str) and then:
        taken = isinstance(then_step, int) and not isinstance(then_step, bool)
        started = printable(then) + (f" (step {then_step:,})" if taken else "")
    else:
        started = "its own random initialization (no init.from)"
    return (f"init.from now names {printable(now)}; this run started from {started} and resumes its own "
            f"checkpoints (step {step:,}): [init] is read only at a run's first start; for a fine-tune of "
            f"{printable(now)} give it a new run.dir (and run.remote)")


def lora_base_refused(cfg: RunConfig, init_record, where: str) -> str:
    """The refusal of a LoRA run whose config's init.from is not the one the checkpoint it would resume (`where`:
    "step 31, in scratch PATH") records its base from (its trainer_state "init": the base's fingerprint record, its
    "from" the config's init.from then); "" for a run without LoRA, with nothing to resume (`init_record` None),
    with a record that names no init.from, or with an init.from that gives the same weights (_same_base: moved to
    another path). The staged copy (`<scratch>/init`) and the remote's (`<remote>/init`) are reused only for that
    very init.from string, and any other is read and staged over them: another base never is. The one rule of
    `run --check`, the launch and staging (a run at its budget's end stages nothing and is not asked)."""
    if not cfg.lora.enabled or not isinstance(init_record, dict):
        return ""
    then, now = init_record.get("from"), cfg.init.from_
    if not isinstance(then, str) or not then or then == now or _same_base(init_record, now, cfg.init.checkpoint):
        return ""
    from minilmd.init_words import describe

    return (f"init.from = {printable(repr(now))}, but this LoRA run's checkpoints ({where}) hold adapters trained on "
            f"the base init.from = {printable(repr(then))} gave: {printable(describe(init_record))}. A LoRA "
            f"checkpoint holds its adapters alone, which resume only on that base: a LoRA run reads [init] at every "
            f"start, from the copy of that base staged in scratch, which another init.from would replace (without a "
            f"run.remote, the only copy). Put init.from = {printable(repr(then))} back to resume this run; for "
            f"adapters on {printable(repr(now))}, give the config a new run.dir (and run.remote)")


def _same_base(init_record: dict, now: str, checkpoint: str) -> bool:
    """Whether init.from `now` gives the very base `init_record` fingerprints (the same weights moved to another
    path: a share remounted elsewhere, a directory renamed), by its fingerprint (a checkpoint's manifest hash, a
    .pth's sha256: the whole file read); False when it cannot be read now (the refusal stands: put it back)."""
    from minilmd.init_source import fingerprint, resolve, same_source

    try:
        return same_source(init_record, fingerprint(resolve(now, checkpoint)))
    except (ValueError, OSError):  # InitSourceError, Unreadable
        return False


def moved_on(cfg: RunConfig, init_record) -> str:
    """"init.from run X has trained beyond step S, the one this run started from ..." when `init_record` (the
    resumed checkpoint's trainer_state "init": what [init] from was, with its step) names a step of the run
    init.from names and that run's state.json now records a later step; "" otherwise (init.from a checkpoint, a
    root or a .pth, not a run; nothing recorded; a run that cannot be read now)."""
    from minilmd.init_source import predecessor, predecessor_report

    step = init_record.get("step") if isinstance(init_record, dict) else None
    if not cfg.init.from_ or not isinstance(step, int) or isinstance(step, bool):
        return ""
    try:
        pred = predecessor(cfg.init.from_)
        report = predecessor_report(pred) if pred is not None else None
    except (ValueError, OSError):  # InitSourceError, Unreadable: said by the checks that read it
        return ""
    progress = (report.state or {}).get("progress") if report is not None else None
    now = progress.get("step") if isinstance(progress, dict) else None
    if pred is None or not isinstance(now, int) or isinstance(now, bool) or now <= step:
        return ""
    assert report is not None  # pred is not None
    doing = "and has finished" if report.outcome == "done" else f"({report.phase or 'not finished'})"
    return (f"init.from: the run {pred.name} has trained beyond step {step:,}, the one this run started from: it is "
            f"at step {now:,} now {doing}; this run stays a fine-tune of step {step:,}: for a fine-tune of the new "
            f"model, give this stage a new run.dir (and run.remote)")
