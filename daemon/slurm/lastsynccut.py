"""A preempted Slurm job's trainer save and last sync, cut at the job's end so that the requeue still runs.

After a preemption (or the time-limit warning) the last sync is waited for while it moves (daemon/jobs/syncworker.py
`final_sync`); on one server that is right, in a Slurm job the job's end kills it all: a copy slower than the grace
ends with the supervisor SIGKILLed before `scontrol requeue`, the job never requeued (the run stops for good) and
state.json left saying the sync runs. So once the job's end (daemon/slurm/jobend.py) is REQUEUE_MARGIN_S away, a
trainer still saving is SIGKILLed (daemon/ending.py; the save is atomic too), a last sync still copying is abandoned,
one not begun is not begun, and the run ends as requeued, its reason saying where the next start resumes. A guessed
end (neither scontrol nor the environment told it) cuts nothing after `minilmd stop`'s signal: the job is not
ending. The sync is atomic (daemon/jobs/sync.py): a copy goes to a temporary name and is put
in place only once whole and read back, so the remote keeps its previous good checkpoint, and LATEST names it; the
abandoned copy stops at its next chunk, or before it is renamed into place, LATEST repointed or older steps pruned,
and removes its temporary name itself, and one the exit cuts short is removed
by the next sync of the run (daemon/jobs/sync_leftovers.py: at once on this node, whose pid is gone by then; from
another node once a day old, since a name of another host may be a live copy there). Outside a Slurm job, and in
one not preempted, nothing of this applies. Torch-free.
"""
from __future__ import annotations

from collections.abc import Callable

from minilmd import names
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base import knobs, stoprequest
from minilmd.daemon.base.runstate import now
from minilmd.daemon.jobs.syncworker import SyncWorker
from minilmd.daemon.slurm.job import SlurmJob

FINAL_SYNC_WAIT_S = knobs.FINAL_SYNC_WAIT.default_s
"""By default (MINILMD_FINAL_SYNC_WAIT sets it: daemon/base/knobs.py), how long a Slurm job's last sync may wait
(for room on run.remote, for its owner record: SyncWorker.final_sync) from the run's entering `stopping`. On one
server that wait holds nothing but the supervisor; in a Slurm job it holds the whole allocation, idle, until the time
limit (hours, days), and what it waits for takes a person. 15 minutes rides out a cleanup or a teammate's fix under
way, at the cost of a quarter hour of the nodes; then the newest checkpoint the remote lacks is kept in run.dir and
the job requeued, or ends saying where it is (daemon/slurm/unsynced_end.py)."""


def may_wait(slurm: SlurmJob | None, stopping_since: float, clock: Callable[[], float] = now,
             wait_s: float = FINAL_SYNC_WAIT_S) -> bool:
    """Whether the last sync may (still) wait for room or for the owner record: always outside Slurm, in a Slurm
    job for `wait_s` (FINAL_SYNC_WAIT_S, or the knob's) from the run's entering `stopping` (`stopping_since`)."""
    return slurm is None or clock() - stopping_since < wait_s


def due(slurm: SlurmJob, sync: SyncWorker, cfg, state, emit: Callable[..., None],
        clock: Callable[[], float] = now) -> str | None:
    """The words of the cut once the preempted job's end is near and its last sync has not ended (the running one
    abandoned; said; SlurmJob.sync_cut set for its plan); None otherwise: the last sync goes on."""
    if slurm.sync_cut:
        return slurm.sync_cut
    if not slurm.preempted_by or not sync.enabled or (sync.worker is not None and sync.worker.done):
        return None  # not preempted, no remote, or a sync just ended: final_sync collects it first
    local = max(local_checkpoint_steps(cfg.checkpoint_dir), default=None)
    if local is None or not reached(slurm, cfg, clock):
        return None  # nothing to sync (final_sync ends at once), or time left
    running = sync.running_for()
    abandoned = sync.abandon("the job's end is near")  # first: a repoint of LATEST under way ends, or is waited for
    remote = state.remote_checkpoint.step if state.remote_checkpoint is not None else None
    words = cut_words(remote, local, cfg.checkpoint_dir)
    slurm.sync_cut = words
    sync.state.sync.error = words
    if abandoned:
        if sync.syncer is not None:
            sync.syncer.abandoned = words  # its SyncAbandoned says why, in the cut's words
        emit("sync", f"{words} (the copy, running for {running:.0f}s, is abandoned: nothing more of it is put in "
                     f"place)")
    else:
        emit("sync", f"{words} (no copy was running: none is begun)")
    return words


def reached(slurm: SlurmJob, cfg, clock: Callable[[], float] = now) -> bool:
    """Whether the preempted job's deadline (its end less REQUEUE_MARGIN_S) has come. A guessed end (neither
    scontrol nor the environment told it) is none after `minilmd stop`'s signal (its SIGUSR2: jobend.read; an older
    supervisor's SIGTERM, its request read here): that request ends no job."""
    if not slurm.preempted_by:
        return False
    at = clock()
    end = slurm.job_end(at)  # as far as Slurm has answered: the deadline moves with its answer
    if end.deadline is None or at < end.deadline:
        return False
    return not (end.guessed and stoprequest.honoured(cfg.run_dir) is not None)


def save_cut(slurm: SlurmJob, sync: SyncWorker, cfg, state, waited: float) -> str:
    """The words of a trainer's save cut at the job's end (SIGKILLed `waited` seconds after its SIGTERM; the
    caller kills it), SlurmJob.sync_cut set for its plan, a running sync abandoned: no last sync then."""
    local = max(local_checkpoint_steps(cfg.checkpoint_dir), default=None)
    abandoned = sync.abandon("the job's end is near")  # first: a repoint of LATEST under way ends, or is waited for
    remote = state.remote_checkpoint.step if state.remote_checkpoint is not None else None
    what = f"the trainer's save cut at the job's end (still saving {waited:.0f}s after its SIGTERM: SIGKILL; a " \
           f"save is put in place whole or not at all)"
    if sync.enabled:
        words = cut_words(remote, local, cfg.checkpoint_dir, what=f"{what}, and the last sync")
    else:
        words = f"{what}: the next start resumes from scratch's newest checkpoint if it runs on this node"
    slurm.sync_cut = words
    if abandoned:
        sync.state.sync.error = words
    return words


def cut_words(remote: int | None, local: int | None, checkpoint_dir, what: str = "last sync") -> str:
    """Where the run's next start (the requeued job, or a start by hand after a stop) resumes, in words."""
    if remote is not None and (local is None or remote >= local):
        return (f"{what} cut at the job's end: run.remote keeps step {remote}, the newest; the next start resumes "
                f"from it")
    on_remote = f"run.remote keeps step {remote}; the next start resumes from it" if remote is not None else \
        "run.remote holds no checkpoint of this run; the next start begins at step 0"
    if local is None:
        return f"{what} cut at the job's end: {on_remote}"
    return (f"{what} cut at the job's end: {on_remote}, or from scratch's step {local} if it runs on this node "
            f"({checkpoint_dir / names.step_name(local)})")
