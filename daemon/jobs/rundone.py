"""A run already done: the checkpoint a launch would resume from is at its budget's last step (`run --check` and
the launch alike, daemon/jobs/resumefrom.py finds that checkpoint). Before, `--check` said "resumes from step 30"
and the launch staged, fetched, started a trainer that had nothing to train, synced and exited 0; a tmux launcher
or a systemd restart did it again. Now both say so and the launch starts nothing (exit 0): the budget raised in the
config trains on from there. Torch-free; the plan (numpy) is read only when there is a checkpoint.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from minilmd.config import RunConfig
from minilmd.probes import bounded_probe
from minilmd.urls import is_url

if TYPE_CHECKING:
    from minilmd.plan.trainer_state import Trained


class Done(str):
    """The line that says the run is done: a `str` for `run --check` to print as it is, a type for the launch to
    find among the lines resumefrom gives (daemon/preflight.py launch). `done`: what its checkpoint trained."""

    done: Trained | None = None


def done_line(cfg: RunConfig, step: int | None, where: str = "", done: Trained | None = None) -> Done | None:
    """"run is done (step S/N; WHERE): nothing to do; ..." when `step` (the checkpoint the launch would resume
    from, `where`: "scratch: PATH" or "remote: PATH") is at the budget's N steps or past it; None otherwise (no
    checkpoint, or a budget that cannot be counted here now: an epoch budget on a corpus that does not say its
    size, a corpus behind a URL or on a share that does not answer: the run decides, as before; a final checkpoint
    in scratch that state.json does not record synced to run.remote: the launch's trainer ends at once, and the
    supervisor's last sync copies it). `done`: what that checkpoint trained (plan/trainer_state.py), which a budget
    in tokens or epochs is counted after, as the trainer counts it."""
    if step is None or step <= 0 or is_url(cfg.data.prepared) or not where.startswith("remote") and \
            not _synced_to(cfg, step):
        return None  # a final checkpoint not synced yet (its supervisor killed before): the launch syncs it
    from minilmd.plan.budget import planned

    answered, plan, _ = bounded_probe(planned, cfg, None, None, done)  # reads the corpus's meta.json: shared storage
    if not answered or plan is None or step < plan.steps:
        return None
    at = f"; {where}" if where else ""
    return _carrying(done, f"run is done (step {step:,}/{plan.steps:,}{at}): nothing to do; to train on, raise the "
                           f"budget ({_budget(cfg)}) in the config, or give the config a new run.dir (and run.remote) "
                           f"to train again from step 0")


def _carrying(done: Trained | None, line: str) -> Done:
    said = Done(line)
    said.done = done
    return said


def _synced_to(cfg: RunConfig, step: int) -> bool:
    """Whether the checkpoint in scratch at `step` is on run.remote too, as this run.dir's state.json records it
    (or there is no run.remote to sync to)."""
    if not cfg.run.remote:
        return True
    from minilmd.daemon.base.runstate import names_remote, read_state
    from minilmd.daemon.base.statesections import StateJson

    raw = read_state(cfg.run_dir) if cfg.run.dir else None
    synced = StateJson.from_dict(raw).remote_checkpoint if raw is not None else None
    return synced is not None and names_remote(synced.path, cfg.run.remote) and (synced.step or 0) >= step


def _budget(cfg: RunConfig) -> str:
    t = cfg.train
    given = [f"train.{key} = {value:g}" for key, value in
             (("max_steps", t.max_steps), ("max_tokens", t.max_tokens), ("max_epochs", t.max_epochs)) if value]
    return " and ".join(given) if given else "train.max_steps"
