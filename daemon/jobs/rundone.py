"""A run already done: the checkpoint a launch would resume from is at its budget's last step (`run --check` and
the launch alike, daemon/jobs/resumefrom.py finds that checkpoint). Before, `--check` said "resumes from step 30"
and the launch staged, fetched, started a trainer that had nothing to train, synced and exited 0; a tmux launcher
or a systemd restart did it again. Now both say so and the launch starts nothing (exit 0): the budget raised in the
config trains on from there. A run is done only once it is whole: recorded finished, its remote's LATEST naming that
step and a LoRA run's base copy beside it (with scratch wiped, of the base the remote step records); a run whose end
failed is launched, and its last sync repairs the remote. That launch is kept even when the remote is whole: its
supervisor, holding the run lock, writes the `finished` outcome that status, a launcher's restart rule and a later
stage's init.from wait read; a done start holds no lock and writes no state.json.
Torch-free; the plan (numpy) is read only when there is a checkpoint.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from minilmd.config import RunConfig
from minilmd.names import LATEST, step_name
from minilmd.probes import bounded_probe
from minilmd.protocol import ENDED_FINISHED, how_ended
from minilmd.urls import is_url

if TYPE_CHECKING:
    from minilmd.plan.trainer_state import Trained


class Done(str):
    """The line that says the run is done: a `str` for `run --check` to print as it is, a type for the launch to
    find among the lines resumefrom gives (daemon/preflight.py launch). `done`: what its checkpoint trained."""

    done: Trained | None = None


def done_line(cfg: RunConfig, step: int | None, where: str = "", done: Trained | None = None) -> Done | None:
    """"run is done (step S/N; WHERE): nothing to do; ..." when `step` (the checkpoint the launch would resume
    from, `where`: "scratch: PATH" or "remote: PATH") is at the budget's N steps or past it, the run's state.json
    records that it ended finished (a file of an older version read as protocol.how_ended reads it; none at all: a
    run.dir on a new machine) and its remote holds the finished run (`_remote_complete`); None otherwise (no
    checkpoint, or a budget that cannot be counted here now: an epoch budget on a corpus that does not say its
    size, a corpus behind a URL or on a share that does not answer: the run decides, as before; a final checkpoint
    in scratch that state.json does not record synced to run.remote; a run that ended failed or was killed at its
    budget, its last sync cut or failed: the launch's trainer ends at once, and the supervisor's last sync copies
    the checkpoint, the LoRA base, repoints LATEST and ends finished). Before, a finished run whose last sync failed
    after its step was on the remote (LATEST's rename lost, the base's push refused) was "done" here for good: every
    restart said so, exit 0, and a stage after it waited for ever. `done`: what that checkpoint trained
    (plan/trainer_state.py), which a budget in tokens or epochs is counted after, as the trainer counts it."""
    if step is None or step <= 0 or is_url(cfg.data.prepared):
        return None
    recorded = _recorded(cfg)
    if recorded is not None and how_ended(recorded) != ENDED_FINISHED:
        return None  # failed, stopped, killed: the launch ends it, finished once its remote holds it all
    if not where.startswith("remote") and not _synced_to(cfg, step, recorded):
        return None  # a final checkpoint not synced yet (its supervisor killed before): the launch syncs it
    from minilmd.plan.budget import planned

    answered, plan, _ = bounded_probe(planned, cfg, None, None, done)  # reads the corpus's meta.json: shared storage
    if not answered or plan is None or step < plan.steps or not _remote_complete(cfg, step, recorded is not None):
        return None
    at = f"; {where}" if where else ""
    return _carrying(done, f"run is done (step {step:,}/{plan.steps:,}{at}): nothing to do; to train on, raise the "
                           f"budget ({_budget(cfg)}) in the config, or give the config a new run.dir (and run.remote) "
                           f"to train again from step 0")


def _carrying(done: Trained | None, line: str) -> Done:
    said = Done(line)
    said.done = done
    return said


def _recorded(cfg: RunConfig) -> dict | None:
    """This run.dir's state.json as read (None: none, or not one)."""
    from minilmd.daemon.base.runstate import read_state

    return read_state(cfg.run_dir) if cfg.run.dir else None


def _synced_to(cfg: RunConfig, step: int, recorded: dict | None) -> bool:
    """Whether the checkpoint in scratch at `step` is on run.remote too, as this run.dir's state.json records it
    (or there is no run.remote to sync to)."""
    if not cfg.run.remote:
        return True
    from minilmd.daemon.base.runstate import names_remote
    from minilmd.daemon.base.statesections import StateJson

    synced = StateJson.from_dict(recorded).remote_checkpoint if recorded is not None else None
    return synced is not None and names_remote(synced.path, cfg.run.remote) and (synced.step or 0) >= step


def _remote_complete(cfg: RunConfig, step: int, recorded_finished: bool) -> bool:
    """Whether run.remote holds the finished run (no remote: it does): its LATEST names `step`, and a LoRA run's
    base copy is there (basecopy.copy_in_place). A remote that does not answer now: the record decides (a run
    recorded finished had its remote whole when it ended; with no state.json, not done: the launch looks)."""
    if not cfg.run.remote:
        return True
    answered, whole, _ = bounded_probe(_holds_the_end, cfg, step)
    return whole if answered and whole is not None else recorded_finished


def _holds_the_end(cfg: RunConfig, step: int) -> bool | None:
    """_remote_complete's look at the remote (shared storage: in a bounded probe); None when it cannot be opened. A
    LoRA run's base copy there must be of the base its final checkpoint records: scratch's, else (scratch wiped) the
    remote step's own record (before, with scratch wiped, any base's copy passed: a remote `init` of another base,
    which the sync never replaces, made a run whose base was never pushed "done")."""
    from minilmd.daemon.jobs.remote_local import open_remote

    try:
        remote = open_remote(cfg.run.remote)
    except (ValueError, ImportError):
        return None
    if (remote.read_text(LATEST) or "").strip() != step_name(step):
        return False
    manifest, problems = remote.intact(step_name(step))  # sizes, not hashes: LATEST naming a removed step is no end
    if manifest is None or problems:
        return False
    if not cfg.lora.enabled:
        return True
    from minilmd.daemon.jobs.basecopy import copy_in_place
    from minilmd.daemon.jobs.initstage import INIT_DIR
    from minilmd.daemon.jobs.lorabase import trained_on

    base = trained_on(cfg)
    if base is None:  # scratch wiped (or its checkpoint records none): the remote's final step says which base
        from minilmd import checkpoint as ck
        from minilmd.daemon.jobs.sync import Syncer

        try:
            base = Syncer(cfg.checkpoint_dir, cfg.run.remote).recorded_base(step_name(step))
        except ck.CheckpointInvalid:
            return False  # not told: not done; the launch looks, its last sync repairs what is missing
    return copy_in_place(remote, cfg.scratch_dir / INIT_DIR, base)


def _budget(cfg: RunConfig) -> str:
    from minilmd.plan.budget import setting_words

    given = [setting_words(cfg, f"train.{key}") for key in ("max_steps", "max_tokens", "max_epochs")
             if getattr(cfg.train, key)]
    return " and ".join(given) if given else "train.max_steps"
