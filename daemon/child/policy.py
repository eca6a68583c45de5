"""What to do after the trainer ended, or staging failed: the restart rules, in pure functions, and the backoff.

`decide()` takes the classified death (daemon/child/death.py) and the facts the supervisor gathered about it (was the
staged corpus damaged, are foreign processes on our GPU now, how many restarts so far) and returns a `Decision`.
`decide_staging_failure()` is the same for a staging that failed (daemon/jobs/stagingworker.py StagingFailed). Neither
does anything itself, so every rule is testable without processes. Torch-free.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from minilmd import protocol
from minilmd.backoff import exponential
from minilmd.config import RestartSection
from minilmd.daemon.base.states import Action, Cause
from minilmd.daemon.child.death import Death


@dataclass
class Decision:
    action: Action
    """What the supervisor does next (see `Action`)."""
    message: str
    exit_status: int | None = None
    """For Action.FAIL: the supervisor's exit status (2 config, 65 data, 79 gave up)."""
    overrides: dict = field(default_factory=dict)
    """--set overrides to apply to every later launch (micro-batch halving after a CUDA OOM)."""
    counts_as_restart: bool = True
    """Whether the supervisor keeps the no-progress streak this failure brought (restart.no_progress_limit)."""


def backoff_seconds(restart: RestartSection, streak: int, rng: random.Random | None = None) -> float:
    """backoff_initial * 2^(streak-1), capped at backoff_max, jittered (minilmd/backoff.py) so that several runs that
    died together (a node-wide NFS stall) do not come back in lockstep."""
    return exponential(restart.backoff_initial_s, streak, cap_s=restart.backoff_max_s, rng=rng or random.Random())


def decide(death: Death, *, restart: RestartSection, restarts_so_far: int, no_progress_streak: int,
           stop_requested: bool, micro_batch_size: int, grad_accum: int, staged_damaged: bool = False,
           gpu_busy: bool = False, finished: bool = False, cache_cleared: bool = False, gpu_lost: str = "") -> Decision:
    """The rule for one death. `no_progress_streak` counts this attempt already (0 if it saved a new checkpoint).
    `gpu_lost`: the supervisor stopped it because its card's lease was lost to another run (daemon/attempt.py)."""
    cause = death.cause
    if cause == Cause.DONE:
        return Decision(Action.FINISH, "the trainer finished its budget", counts_as_restart=False)
    if finished:
        # its heartbeat said `exiting` and the final checkpoint is saved: killed in a slow teardown, say; a restart
        # would start at the final step, save nothing new and count toward no_progress_limit until we gave up
        return Decision(Action.FINISH, f"the trainer had finished its budget before it ended ({cause}: "
                                       f"{death.detail})", counts_as_restart=False)
    if stop_requested:  # the trainer's own words only when it did not simply stop (killed at the grace, crashed)
        said = "" if cause == Cause.STOPPED else f" ({death.detail})"
        return Decision(Action.STOP, f"stopped on request{said}", counts_as_restart=False)
    if gpu_lost:  # not the trainer's failure: no restart limit counts it, nor is its micro-batch halved
        return Decision(Action.WAIT_GPU, f"{gpu_lost}; the trainer stopped ({death.detail}) so as not to share that "
                                         f"GPU: waiting for a free GPU again", counts_as_restart=False)
    if cause == Cause.CONFIG_ERROR:
        return Decision(Action.FAIL, f"config error, final: {death.detail}", protocol.SUPERVISOR_CONFIG,
                        counts_as_restart=False)
    if cause == Cause.DATA_ERROR and staged_damaged:
        # the staged copy broke under us (truncated, a bad page), not the source: not final
        return Decision(Action.RESTAGE, f"the trainer refused the data and the staged corpus fails verification: "
                                   f"re-staging it ({death.detail})")
    if cause == Cause.DATA_ERROR:
        return Decision(Action.FAIL, f"data error, final: {death.detail}", protocol.EXIT_DATA, counts_as_restart=False)
    if cause == Cause.SCRATCH_FULL:
        # Not the trainer's fault and no restart loop: it launches again only once a checkpoint fits, so neither
        # restart limit counts it (a scratch shared with another job may stay full for hours).
        # the trainer's own words (ScratchFull, fault.json) already begin with "scratch full": said once
        said = death.detail if death.detail.startswith("scratch full") else f"scratch full: {death.detail}"
        return Decision(Action.WAIT_SPACE, said, counts_as_restart=False)
    if restarts_so_far >= restart.max_restarts:
        return Decision(Action.FAIL, f"gave up: {restarts_so_far} restarts reached restart.max_restarts "
                                f"{restart.max_restarts} (last: {cause}: {death.detail})", protocol.SUPERVISOR_GAVE_UP)
    if cause in (Cause.CRASH, Cause.SIGBUS) and cache_cleared and not staged_damaged:
        # a kernel truncated by an earlier kill, now removed: not the run's failure (max_restarts still bounds it)
        return Decision(Action.RESTART, f"the trainer died on a damaged compile-cache entry, now removed: "
                                        f"restarting ({death.detail})", counts_as_restart=False)
    if no_progress_streak >= restart.no_progress_limit:
        return Decision(Action.FAIL, f"gave up: {no_progress_streak} attempts in a row without a new checkpoint "
                                f"(restart.no_progress_limit {restart.no_progress_limit}; last: {cause}: "
                                f"{death.detail})", protocol.SUPERVISOR_GAVE_UP)
    if cause == Cause.SIGBUS:
        if staged_damaged:
            return Decision(Action.RESTAGE, "SIGBUS and the staged corpus fails verification: re-staging it")
        return Decision(Action.RESTART, "SIGBUS, but the staged corpus verifies: restarting")
    if cause == Cause.CUDA_OOM:
        if gpu_busy:
            return Decision(Action.WAIT_GPU, "CUDA OOM with foreign processes on the GPU: waiting for it again")
        if micro_batch_size > 1:
            # The largest divisor of the micro-batch not above its half keeps the global batch exact (5 -> 1).
            half = max(d for d in range(1, micro_batch_size // 2 + 1) if micro_batch_size % d == 0)
            accum = grad_accum * (micro_batch_size // half)
            return Decision(Action.RESTART, f"CUDA OOM with the GPU to ourselves: micro_batch_size "
                                            f"{micro_batch_size} -> {half}, grad_accum {grad_accum} -> {accum} "
                                            f"(global batch {micro_batch_size * grad_accum} -> {half * accum})",
                            overrides={"train.micro_batch_size": half, "train.grad_accum": accum})
        return Decision(Action.RESTART, "CUDA OOM at micro_batch_size 1: nothing left to halve, restarting")
    if cause == Cause.STOPPED:
        return Decision(Action.RESTART, f"the trainer {death.detail}: restarting")
    if cause == Cause.RUN_DIR_FULL:  # asked only once run.dir has room again (rundirwatch.still_full)
        return Decision(Action.RESTART, f"run.dir has room again: restarting ({death.detail})")
    return Decision(Action.RESTART, f"{cause}: {death.detail}")


def decide_staging_failure(error: str, final_status: int | None, *, restart: RestartSection,
                           no_progress_streak: int) -> Decision:
    """The rule for a staging that failed: `final_status` (2 config, 65 data) when retrying cannot help, else None.
    `no_progress_streak` counts this failure already. A retryable failure stages again after a backoff (RESTAGE,
    never a Restart record: no trainer died) until restart.no_progress_limit failures in a row give up (79)."""
    if final_status is not None:
        return Decision(Action.FAIL, error, final_status, counts_as_restart=False)
    if no_progress_streak >= restart.no_progress_limit:
        return Decision(Action.FAIL, f"gave up: staging failed {no_progress_streak} times in a row "
                                     f"(restart.no_progress_limit): {error}", protocol.SUPERVISOR_GAVE_UP)
    return Decision(Action.RESTAGE, f"staging failed: {error}")
