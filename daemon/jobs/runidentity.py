"""A run.dir is one run's timeline: the rule for a restart whose config names another scratch or another run.remote
than the run.dir's records do. `run --check` and the launch ask it alike (daemon/jobs/resumefrom.py `problems`,
after it has found where the launch would resume from), and refuse, exit 2, what it refuses.

Two edits used to lose work in silence:
- a new run.name (run.dir unchanged) moves the default scratch to /dev/shm/minilmd-<uid>/<new name>: the launch
  resumed from the remote's older step, while the old scratch, still this run's, held newer unsynced checkpoints
  and was left in /dev/shm for ever, never mentioned (so did a new run.scratch);
- a new run.remote with an empty scratch trained from step 0 in the same run.dir ("this run has never synced to
  it": sync records are matched by URL), and `status` and `plot` then mixed both timelines.

The rule: a place the run.dir's state.json names (its scratch, by the newest local checkpoint's or the staged
corpus's path; its remote, by the newest synced checkpoint's) that the config no longer names, and that holds a
step newer than the one the launch would resume from (step 0 when none), is refused, with the ways on in words:
put the old setting back, give the config a new run.dir, or give the old place's steps up explicitly (remove the
old scratch; `minilmd run --fresh` for the old remote's timeline: a new lineage in this run.dir). The old scratch's
steps are read from it (its owner.json naming this run.dir, minilmd/scratch.py), since a reboot may have emptied
it; the old remote's step is the one state.json records (another remote is not opened: it may be a store that
does not answer). An old scratch that holds no newer step is no refusal, but is said (`left_behind`), never left
unmentioned. A state.json that is missing or cannot be read refuses nothing (the records of remotewait.py decide
what such a start waits for). Torch-free.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd import names, run_owner, scratch
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base.runstate import load_state, names_remote
from minilmd.daemon.base.statesections import StateJson
from minilmd.untrusted import Unreadable

if TYPE_CHECKING:
    from minilmd.config import RunConfig


@dataclass(frozen=True)
class Recorded:
    """What the run.dir's state.json says of the run's identity."""

    name: str = ""
    """run.name then."""
    scratch: Path | None = None
    """Its scratch: the directory above the newest local checkpoint's checkpoints/, or above the staged corpus."""
    remote: str = ""
    """The remote its newest synced checkpoint is on ("" none)."""
    remote_step: int | None = None
    """That checkpoint's step."""


def recorded(run_dir: Path) -> Recorded | None:
    """The identity state.json records for `run_dir`; None when there is none or it cannot be read."""
    try:
        state = StateJson.from_dict(load_state(run_dir))
    except Unreadable:
        return None
    local = state.local_checkpoint.path if state.local_checkpoint is not None else None
    place = _scratch_of(local, names.CHECKPOINTS) or _scratch_of(state.staging.path, names.STAGED_CORPUS)
    remote = state.remote_checkpoint
    on = remote.path.rstrip("/").rsplit("/", 1)[0] if remote is not None and remote.path else ""
    return Recorded(state.run, place, on, remote.step if remote is not None and on else None)


def _scratch_of(path: str | None, below: str) -> Path | None:
    """The scratch `path` (a checkpoint under scratch/checkpoints/, or scratch/corpus) lies in; None otherwise."""
    if not path or not Path(path).is_absolute():
        return None
    p = Path(path)
    if p.name == below:
        return p.parent
    return p.parent.parent if p.parent.name == below else None


def problems(cfg: RunConfig, start_step: int | None, fresh: bool, remote_unknown: bool = False) -> list[str]:
    """The refusals of a launch that would resume from `start_step` (None: step 0), one per place the run.dir
    records and the config no longer names that holds a newer step (module docstring). `remote_unknown`: run.remote
    does not answer now, so where the launch starts is staging's to find (daemon/jobs/remotewait.py): a run that
    synced to it waits for it, and resumes at least from the step state.json records there. `fresh` (`run --fresh`)
    gives the old remote's timeline up, not the old scratch's checkpoints."""
    rec = recorded(cfg.run_dir)
    if rec is None:
        return []
    waits_for = rec.remote_step if remote_unknown and not fresh and _same_remote(rec, cfg) else None
    floor = start_step if start_step is not None else waits_for or 0
    out = []
    steps = _old_scratch_steps(cfg, rec)
    if steps and max(steps) > floor and not _moved_by_a_new_slurm_job(cfg, rec):
        out.append(_scratch_refusal(cfg, rec, max(steps), start_step))
    if not fresh and rec.remote and not _same_remote(rec, cfg) and (rec.remote_step or 0) > floor:
        out.append(_remote_refusal(cfg, rec, start_step))
    return out


def left_behind(cfg: RunConfig) -> str:
    """A note for an old scratch of this run (the records' scratch, not the config's) that still holds checkpoints
    none newer than where the launch resumes (`problems` refuses those, but for a new Slurm job's: see there): where
    it is, what it holds, that nothing removes it; "" when there is none."""
    rec = recorded(cfg.run_dir)
    steps = _old_scratch_steps(cfg, rec) if rec is not None else []
    if not steps or rec is None:
        return ""
    return (f"{rec.scratch}, this run's scratch before ({_setting(cfg, rec)}), still holds checkpoint steps "
            f"{', '.join(map(str, steps[-3:]))}: nothing resumes from it or removes it now; remove it (rm -r "
            f"{rec.scratch}) to free its space")


def _old_scratch_steps(cfg: RunConfig, rec: Recorded) -> list[int]:
    """The checkpoint steps in the recorded scratch, when it is another than the config's and this run's own (its
    owner.json names this run.dir, no other user's or a link: minilmd/scratch.py); [] otherwise."""
    old = rec.scratch
    if old is None or _same_path(old, cfg.scratch_dir):
        return []
    try:
        owner = scratch.read_owner(old)
    except (ValueError, OSError):
        return []
    if owner is None or not run_owner.is_run(owner, cfg.run_dir) or scratch.problems(old, cfg.run_dir, False):
        return []
    return sorted(local_checkpoint_steps(old / names.CHECKPOINTS))


def _moved_by_a_new_slurm_job(cfg: RunConfig, rec: Recorded) -> bool:
    """The default scratch moved only because this is another Slurm job (one scratch per job: minilmd/scratch.py):
    no refusal, since exit 2 would end the job chain a user left unattended; the job resumes from run.remote, as a
    job on another node would, and the old scratch is said as left behind (`left_behind`)."""
    return not cfg.run.scratch and bool(os.environ.get(names.SLURM_JOB_ENV)) and \
        (not rec.name or rec.name == cfg.run.name)


def _same_path(a: Path, b: Path) -> bool:
    return a.absolute().resolve() == b.absolute().resolve()


def _same_remote(rec: Recorded, cfg: RunConfig) -> bool:
    return bool(rec.remote) and names_remote(rec.remote, cfg.run.remote)


def _setting(cfg: RunConfig, rec: Recorded) -> str:
    """Which setting moved it, in words."""
    if rec.name and rec.name != cfg.run.name and not cfg.run.scratch:
        return f"run.name was {rec.name!r}, it is {cfg.run.name!r} now, and the default scratch follows it"
    if not cfg.run.scratch:  # the same name: in a Slurm job the default is one scratch per job (scratch.py)
        return f"the default scratch is {cfg.scratch_dir} now"
    return f"run.scratch is {cfg.scratch_dir} now"


def _from(start_step: int | None) -> str:
    return f"step {start_step}" if start_step is not None else "step 0"


def _scratch_refusal(cfg: RunConfig, rec: Recorded, step: int, start_step: int | None) -> str:
    back = f"put run.name = {rec.name!r} back, or set run.scratch = {str(rec.scratch)!r}" \
        if rec.name and rec.name != cfg.run.name and not cfg.run.scratch else \
        f"set run.scratch = {str(rec.scratch)!r} back"
    return (f"this run.dir's {names.STATE} records its scratch at {rec.scratch} ({_setting(cfg, rec)}), which holds "
            f"checkpoint step {step}, newer than {_from(start_step)} this launch would start from: its steps since "
            f"would be lost, and that scratch left behind. {back[0].upper()}{back[1:]} to resume from step {step}; or, "
            f"to give those steps up, remove it (rm -r {rec.scratch}) and run again")


def _remote_refusal(cfg: RunConfig, rec: Recorded, start_step: int | None) -> str:
    now = f"run.remote is {cfg.run.remote} now" if cfg.run.remote else "run.remote is unset now"
    return (f"this run.dir's {names.STATE} records step {rec.remote_step} synced to {rec.remote}; {now}, and this "
            f"launch would start from {_from(start_step)}: a new timeline in a run.dir that holds another one "
            f"(`status` and `plot` would mix them). Put run.remote = {rec.remote!r} back to resume from step "
            f"{rec.remote_step}; or give the config a new run.dir for a new run; or start this run.dir over from "
            f"{_from(start_step)} with `minilmd run --fresh` ({rec.remote} is left as it is)")
