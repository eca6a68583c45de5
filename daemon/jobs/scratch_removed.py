"""run.scratch removed by hand while the run trained (`rm -rf /dev/shm/minilmd-<uid>/RUN`, a common way to free
/dev/shm; user9 finding 2), in the supervisor's words. The trainer refuses the save that finds it gone and exits
(minilmd/checkpoint_pin.py ScratchGone: nothing made again by path); the next attempt's claim finds no scratch,
makes and claims it afresh, stages and resumes from the remote's newest checkpoint (daemon/jobs/stagingworker.py).
A directory of the user's own made at its name meanwhile is still refused (minilmd/scratch.py ScratchChanged), in
words that say what `rm -r` of it loses against the remote's newest step. Torch-free.
"""
from __future__ import annotations

from pathlib import Path

from minilmd.scratch import ScratchChanged


def claimed_again(scratch: Path) -> str:
    return f"run.scratch {scratch} was removed while the run trained: claimed afresh, staging again"


def resumed(scratch: Path, resumed_from: int | None, trained_to: int | None, kept: int | None = None) -> str:
    """Once staged again: where the trainer resumes (`resumed_from`: the checkpoint fetched from the remote; else
    `kept`, the newest checkpoint a partly removed scratch still holds; None: step 0) and which steps it trains again
    (up to `trained_to`, the step the removed scratch's trainer had reached, when the supervisor saw it)."""
    if resumed_from is not None:
        where, first = f"resuming from step {resumed_from:,} (the remote's newest)", resumed_from + 1
    elif kept is not None:
        where, first = f"resuming from step {kept:,} (the newest checkpoint left in it)", kept + 1
    else:
        where, first = "starting from step 0 (no checkpoint on a run.remote to resume from)", 1
    again = f"; steps {first:,}..{trained_to:,} trained again" if trained_to is not None and trained_to >= first \
        else ""
    return f"run.scratch {scratch} was removed while the run trained: staged again; {where}{again}"


def changed(e: ScratchChanged, scratch: Path, remote_step: int | None) -> str:
    """The claim's refusal of what stands at scratch's path now; for a directory of the user's own, what `rm -r` of
    it loses against the remote's newest step (`remote_step`: state.json's record; None: nothing synced)."""
    words = "; ".join(e.problems)
    if not e.remade:
        return words
    newest = e.newest_there
    if remote_step is None:
        loses = f"steps up to {newest:,}, the only copy" if newest is not None else "no checkpoint"
        return f"{words}; no step of the run is on a run.remote: `rm -r {scratch}` loses {loses}, and the run, " \
               f"started again, starts from step 0"
    loses = f"steps {remote_step + 1:,}..{newest:,}, which are only there" if newest is not None and \
        newest > remote_step else "no step the remote lacks"
    return f"{words}; run.remote's newest is step {remote_step:,}: `rm -r {scratch}` loses {loses}, and the run, " \
           f"started again, resumes from step {remote_step:,}"


def lost_at_end(scratch: Path, lost: str, step: int | None, remote_step: int | None, again: bool) -> str:
    """The trainer ended done, but scratch was removed (`lost`: how, minilmd/scratch_remade.py `lost`) before the
    last sync copied its last checkpoint (fault11 F2): not a checkpoint "saved elsewhere". `again`: this supervisor
    stages again now; else the next `minilmd run` does (a stop was asked, a Slurm job, a sync still hanging)."""
    at = f"step {step:,}" if step is not None else "its last step"
    if remote_step is not None:
        first = f"{remote_step + 1:,}" if step is None or step > remote_step else None
        resumes = f"resumes from step {remote_step:,}, run.remote's newest" + \
            (f", and trains steps {first}..{step:,} again" if first and step is not None else "")
    else:
        resumes = "starts from step 0 again (no step of the run is on run.remote)"
    then = f"claimed afresh, staging again: the run {resumes}" if again else \
        f"the next `minilmd run` claims it afresh and stages; the run {resumes}"
    return (f"the trainer ended done (exit 0) at {at}, but run.scratch {scratch} was removed before the last sync "
            f"copied that step ({lost}): {then}")
