"""How often in a row a Slurm job is requeued because its last sync gave up: at most MAX_UNSYNCED_REQUEUES times.

A last sync that cannot finish within the job (daemon/slurm/unsynced_end.py) keeps the checkpoint in run.dir and
requeues the job; a run.remote that stays refused (full, its owner record another's) makes every requeued job wait
lastsynccut.FINAL_SYNC_WAIT_S (15 min) on its allocation and requeue again, for ever, in a loop nobody watches. So
those requeues are counted in state.json's slurm section (`unsynced_requeues`: the count, and run.remote's step and
scratch's newest step at the last one), carried from one start of the run to the next (`carry`, in a Slurm job), and
begun again from 0 once a sync has put a newer step on run.remote (`synced`, and `consecutive` at the give-up) or
the run has saved a newer checkpoint since (it made progress: not a loop). The give-up after MAX_UNSYNCED_REQUEUES
requeues in a row is not requeued: the run ends failed for good (protocol.SUPERVISOR_GAVE_UP, as after too many
restarts without progress), its reason naming the kept copy, run.remote's error and what to do. Torch-free.
"""
from __future__ import annotations

from typing import Any

MAX_UNSYNCED_REQUEUES = 3
"""Requeues in a row after a last sync that gave up, with no sync and no newer checkpoint between them; the next
give-up ends the run failed (exit 79) instead of a fourth: at most about an hour of allocations spent waiting."""
KEY = "unsynced_requeues"
"""The record's name in state.json's slurm section: {"count": N, "remote_step": R, "step": S}."""


def _step(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _record(raw: Any) -> dict | None:
    """The record as read from a state.json (the run's own file; a field of the wrong type: no record)."""
    if not isinstance(raw, dict) or _step(raw.get("count")) is None:
        return None
    return {"count": raw["count"], "remote_step": _step(raw.get("remote_step")), "step": _step(raw.get("step"))}


def carry(slurm: dict | None, previous: dict | None) -> None:
    """At a start in a Slurm job (`slurm`: this start's section): the record of the previous start's section."""
    if isinstance(slurm, dict) and isinstance(previous, dict) and (record := _record(previous.get(KEY))):
        slurm[KEY] = record


def synced(slurm: dict | None, remote_step: int | None) -> None:
    """A sync put step `remote_step` on run.remote: a record from before it (an older remote step) goes."""
    if not isinstance(slurm, dict) or (record := _record(slurm.get(KEY))) is None or remote_step is None:
        return
    if record["remote_step"] is None or remote_step > record["remote_step"]:
        del slurm[KEY]


def consecutive(slurm: dict, remote_step: int | None, newest_step: int | None) -> int:
    """The requeues in a row before this give-up: 0 when there was none, or a sync (a newer remote step) or
    progress (a newer checkpoint in scratch) came since the last."""
    record = _record(slurm.get(KEY))
    if record is None:
        return 0
    if remote_step is not None and (record["remote_step"] is None or remote_step > record["remote_step"]):
        return 0
    if newest_step is not None and (record["step"] is None or newest_step > record["step"]):
        return 0
    return record["count"]


def requeued(slurm: dict, count: int, remote_step: int | None, newest_step: int | None) -> None:
    """This give-up requeues the job: the `count`-th in a row, recorded with the steps it is judged by next time."""
    slurm[KEY] = {"count": count, "remote_step": remote_step, "step": newest_step}


def spent_words(before: int, sync_problem: str, where: str, copied: bool) -> str:
    """The reason of the give-up that is not requeued: `before` requeues in a row, run.remote's error, where the
    checkpoint is (unsynced_end._keep's words; `copied`: in run.dir), what to do."""
    resumes = "its start resumes from that copy and syncs it" if copied else "its start syncs what it finds"
    return (f"the last sync gave up again ({sync_problem}), after {before} requeue(s) in a row for it with no sync "
            f"and no newer checkpoint between (at most {MAX_UNSYNCED_REQUEUES}): not requeued again, each requeued "
            f"job would wait the same on its allocation; {where}: fix run.remote (free room on it, or have its "
            f"owner record made this run's or removed), then resubmit the job (sbatch): {resumes}")
