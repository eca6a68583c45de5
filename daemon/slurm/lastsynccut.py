"""A preempted Slurm job's last sync, cut at the job's end so that the requeue still runs.

After a preemption (or the time-limit warning) the last sync is waited for while it moves (daemon/jobs/syncworker.py
`final_sync`); on one server that is right, in a Slurm job the job's end kills it all: a copy slower than the grace
ends with the supervisor SIGKILLed before `scontrol requeue`, the job never requeued (the run stops for good) and
state.json left saying the sync runs. So once the job's end (daemon/slurm/jobend.py) is REQUEUE_MARGIN_S away, a
last sync still copying is abandoned, one not begun is not begun, and the run ends as requeued, its reason saying
where the requeued job resumes. The sync is atomic (daemon/jobs/sync.py): a copy goes to a temporary name and is put
in place only once whole and read back, so the remote keeps its previous good checkpoint, and LATEST names it; the
abandoned copy stops at its next chunk and removes its temporary name itself, and one the exit cuts short is removed
by the next sync of the run (daemon/jobs/sync_leftovers.py: at once on this node, whose pid is gone by then; from
another node once a day old, since a name of another host may be a live copy there). Outside a Slurm job, and in
one not preempted, nothing of this applies. Torch-free.
"""
from __future__ import annotations

from collections.abc import Callable

from minilmd import names
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base.runstate import now
from minilmd.daemon.jobs.syncworker import SyncWorker
from minilmd.daemon.slurm.job import SlurmJob


def due(slurm: SlurmJob, sync: SyncWorker, cfg, state, emit: Callable[..., None],
        clock: Callable[[], float] = now) -> str | None:
    """The words of the cut once the preempted job's end is near and its last sync has not ended (the running one
    abandoned; said; SlurmJob.sync_cut set for its plan); None otherwise: the last sync goes on."""
    if slurm.sync_cut:
        return slurm.sync_cut
    if not slurm.preempted_by or not sync.enabled or (sync.worker is not None and sync.worker.done):
        return None  # not preempted, no remote, or a sync just ended: final_sync collects it first
    local = max(local_checkpoint_steps(cfg.checkpoint_dir), default=None)
    if local is None:
        return None  # nothing to sync: final_sync ends at once
    deadline = slurm.job_end().deadline
    if deadline is None or clock() < deadline:
        return None
    remote = state.remote_checkpoint.step if state.remote_checkpoint is not None else None
    running = sync.running_for()
    words = cut_words(remote, local, cfg.checkpoint_dir)
    slurm.sync_cut = words
    if sync.abandon(words):
        emit("sync", f"{words} (the copy, running for {running:.0f}s, is abandoned: nothing of it is put in place)")
    else:
        sync.state.sync.error = words
        emit("sync", f"{words} (no copy was running: none is begun)")
    return words


def cut_words(remote: int | None, local: int, checkpoint_dir) -> str:
    """Where the requeued job resumes, in words."""
    if remote is not None and remote >= local:
        return (f"last sync cut at the job's end: run.remote keeps step {remote}, the newest; the requeued job "
                f"resumes from it")
    on_remote = f"run.remote keeps step {remote}; the requeued job resumes from it" if remote is not None else \
        "run.remote holds no checkpoint of this run; the requeued job starts from step 0"
    return (f"last sync cut at the job's end: {on_remote}, or from scratch's step {local} if it lands on this node "
            f"({checkpoint_dir / names.step_name(local)})")
