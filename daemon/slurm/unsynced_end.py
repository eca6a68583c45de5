"""A Slurm job whose last sync cannot finish within the job: its newest checkpoint kept in run.dir, the job requeued.

The last sync of a run in a Slurm job waits for room on run.remote, or for its owner record, for
lastsynccut.FINAL_SYNC_WAIT_S at most (the wait holds the allocation), and may fail outright (its tries spent).
Before, the run then ended `failed`, exit 1, which no one requeues, its newest checkpoint left on the job's
node-local scratch, which the job's end may wipe: a resubmission trained those steps again. Now that checkpoint is
copied into run.dir (daemon/jobs/keptcopy.py: shared storage, the run's own; one copy at most) and the job is
requeued through the preemption's path (state.json's outcome written first, then `scontrol requeue`), so that its
next start fetches it back, resumes from it and syncs it. A job Slurm will not requeue (`Requeue=0`: sbatch
--no-requeue, or JobRequeue=0 in slurm.conf), or a requeue that fails, ends `failed` (non-final) with a reason
that says where the checkpoint is and what to do. Such requeues in a row are bounded (daemon/slurm/requeue_bound.py:
a remote that stays refused would requeue the job for ever): the give-up after MAX_UNSYNCED_REQUEUES of them ends
the run failed for good, exit 79, saying why and what to do. A preempted job whose last sync failed is requeued the
same way, within the same bound (`plan` with `preempted`: its copy bounded by the job's end; before, it ended
`failed`, exit 1, not requeued, and a resubmission by hand was the only way on); one whose stop was asked for
(`minilmd stop`) or that is being cancelled is not, its checkpoint kept in run.dir all the same while the job's end
leaves time (`at_preemption`); nor is a run whose run.remote is another run's (final, exit 2: `keep_refused`). Not
for a run.dir that is full or was removed (daemon/ending.py: exit 73, final).
Torch-free.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from minilmd import protocol
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.jobs import keptcopy
from minilmd.daemon.slurm import requeue_bound
from minilmd.daemon.slurm.job import SlurmJob, job_info


@dataclass
class UnsyncedEnd:
    """How the run ends: requeued or not, and the reason status shows (the failure's message when not)."""

    requeue: bool
    words: str
    exit: int = protocol.SUPERVISOR_RETRY
    """The supervisor's exit status when not requeued: SUPERVISOR_GAVE_UP once requeue_bound's requeues are spent."""


def requeueable(slurm: SlurmJob, preempted: bool = False) -> bool:
    """Whether Slurm requeues this job when asked: not when `scontrol show job` says Requeue=0 (an answer without
    the field, or none, is asked anyway: `scontrol requeue` refusing it is said then). After a preemption, whose
    copy may have taken the time up to the job's deadline (jobend.REQUEUE_MARGIN_S), the answer SlurmJob.plan had
    (`requeue_answer`) is taken, not asked again; asked within SIGNAL_TIMEOUT_S when it has none."""
    if preempted and slurm.requeue_answer is not None:
        return slurm.requeue_answer != "0"
    runner = slurm.signal_runner if preempted else slurm.runner
    return job_info(slurm.alloc.job_id, runner).get("Requeue", "1") != "0"


def _keep(cfg, sync, state, emit: Callable[..., None], sync_problem: str,
          wait_s: float = keptcopy.KEEP_WAIT_S) -> tuple[keptcopy.Kept, str]:
    """The newest checkpoint run.remote lacks copied into run.dir (said in the log, recorded in state.json's slurm
    section): what was kept, and where the checkpoint is, in words."""
    remote = state.remote_checkpoint.step if state.remote_checkpoint is not None else None
    expected = sync.syncer.expected if sync.syncer is not None else None
    kept = keptcopy.keep(cfg, expected, remote, wait_s)
    on_remote = f"run.remote's newest is step {remote}" if remote is not None else "run.remote holds none of its"
    if kept.step is not None:
        where = f"its newest checkpoint, step {kept.step}, which run.remote lacks ({on_remote}), is kept in " \
                f"{kept.where}"
        emit("sync", f"{where}: the last sync could not put it on run.remote within the job ({sync_problem})")
        state["slurm"]["unsynced_kept"] = str(kept.where)
        return kept, where
    where = f"{kept.why_not}; the checkpoint stays in {cfg.checkpoint_dir}"
    if cfg.scratch_is_default:
        where += ", this job's node-local scratch, which the job's end may wipe"
    return kept, where


def keep_wait_s(slurm: SlurmJob, clock: Callable[[], float] = time.time) -> float:
    """How long a preempted job's copy into run.dir may take: until its deadline before the job's end (KEEP_WAIT_S
    at most); under 1 s nothing more is begun."""
    at = clock()
    deadline = slurm.job_end(at).deadline
    return keptcopy.KEEP_WAIT_S if deadline is None else min(keptcopy.KEEP_WAIT_S, deadline - at)


def at_preemption(slurm: SlurmJob, cfg, sync, state, emit: Callable[..., None], problem: str,
                  sync_problem: str, clock: Callable[[], float] = time.time) -> str:
    """A preempted job whose last sync failed and that is not requeued (a stop asked for, a job cancelled: its
    plan's `problem`, daemon/slurm/job.py): the checkpoint kept in run.dir all the same while the job's end leaves
    time for it, and `problem` saying where."""
    if (wait_s := keep_wait_s(slurm, clock)) < 1.0:
        return problem  # the job's end is here: nothing more is begun
    kept, where = _keep(cfg, sync, state, emit, sync_problem, wait_s)
    if kept.step is None:
        return problem
    return f"{problem}; {where}: once run.remote takes this run's checkpoints again, resubmit the job (sbatch): " \
           f"its start resumes from that copy and syncs it"


def keep_refused(slurm: SlurmJob, cfg, sync, state, emit: Callable[..., None], refusal: str,
                 clock: Callable[[], float] = time.time) -> str:
    """A run whose run.remote is another run's ends failed for good, not requeued (daemon/ending.py): its newest
    checkpoint kept in run.dir all the same (the job's end may wipe the node's scratch), while the job's end leaves
    time for it; where the checkpoint is, in words. The next start, once run.remote is a directory of the run's own,
    fetches that copy back and syncs it there."""
    wait_s = keep_wait_s(slurm, clock) if slurm.preempted_by else keptcopy.KEEP_WAIT_S
    if wait_s < 1.0:
        return f"no time left before the job's end to copy it into run.dir; the checkpoint stays in " \
               f"{cfg.checkpoint_dir}"
    return _keep(cfg, sync, state, emit, refusal, wait_s)[1]


def plan(slurm: SlurmJob, cfg, sync, state, emit: Callable[..., None], sync_problem: str,
         preempted: str = "", slurm_requeues: bool = False,
         clock: Callable[[], float] = time.time) -> UnsyncedEnd:
    """The checkpoint kept (said in the log) and how the run ends (module docstring). `preempted`: a preempted
    job's last sync that failed: the preemption in words ("preempted by USR1"; daemon/slurm/job.py Plan): its
    copy bounded by the job's end, and `slurm_requeues` when Slurm requeues the job itself (not asked again)."""
    wait_s = keep_wait_s(slurm, clock) if preempted else keptcopy.KEEP_WAIT_S
    if wait_s >= 1.0:
        kept, where = _keep(cfg, sync, state, emit, sync_problem, wait_s)
    else:  # the job's end is here: nothing more is begun
        kept = keptcopy.Kept(None, keptcopy.place(cfg), "no time left before the job's end to copy it")
        where = f"{kept.why_not}; the checkpoint stays in {cfg.checkpoint_dir}"
    section = state["slurm"]
    remote = state.remote_checkpoint.step if state.remote_checkpoint is not None else None
    newest = max(local_checkpoint_steps(cfg.checkpoint_dir), default=None)
    before = requeue_bound.consecutive(section, remote, newest)
    if before >= requeue_bound.MAX_UNSYNCED_REQUEUES:  # a remote that stays refused: no requeue loop for ever
        return UnsyncedEnd(False, requeue_bound.spent_words(before, sync_problem, where, kept.step is not None),
                           protocol.SUPERVISOR_GAVE_UP)
    failed = f"the last sync failed ({sync_problem})" if preempted else \
        f"the last sync could not finish within the job ({sync_problem})"
    may = slurm_requeues or requeueable(slurm, bool(preempted))
    if slurm_requeues or (may and (kept.step is not None or not cfg.scratch_is_default)):
        section["requeued"], section["state"] = True, "REQUEUED"
        requeue_bound.requeued(section, before + 1, remote, newest)
        itself = "; Slurm requeued it itself" if slurm_requeues else ""
        by = f"requeued by Slurm ({preempted})" if preempted else "requeued by Slurm"
        return UnsyncedEnd(True, f"{by}: {failed}; {where}; the requeued job resumes from it and syncs it{itself}")
    how = "resubmit the job (sbatch) once run.remote takes this run's checkpoints again: its start " \
          "resumes from that copy and syncs it" if kept.step is not None else \
        "resubmit the job once run.remote takes this run's checkpoints again"
    why = "Slurm does not requeue this job (Requeue=0)" if not may else \
        "not requeued: a requeued job on another node would not find it"
    head = f"the job was {preempted}: " if preempted else ""
    return UnsyncedEnd(False, f"{head}{failed}; {where}; {why}: {how}")
