"""The supervisor's phases and the transitions allowed between them, in one table, and the sub-states its parts
report.

Like supervisord's process states: the main loop is the only place that changes phase, and every change goes
through `check_transition`, so a transition that is not in the table is a bug that fails loudly instead of a
state nobody thought about. The sub-states (sync, staging, the restart policy's action, the cause of a trainer's
death) are enums too; their values are the strings state.json, events.jsonl and `minilmd status` show. Torch-free.
"""
from __future__ import annotations

from enum import Enum


class Named(str, Enum):
    """A state whose value is the string written to state.json and shown by status; `str()` and f-strings give
    that value, never `Class.MEMBER`."""

    def __str__(self) -> str:
        return self.value


class Phase(Named):
    WAITING_SCRATCH = "waiting_scratch"  # the launch, before its supervisor: no room to make scratch (scratchclaim.py)
    WAITING_INIT = "waiting_init"  # init.from names another run that has not finished: polling its state.json
    WAITING_GPU = "waiting_gpu"  # polling NVML until enough devices look free for stable_polls polls
    STAGING = "staging"  # copying/verifying the prepared corpus into scratch (and fetching a remote checkpoint)
    STARTING = "starting"  # the trainer is launched; no heartbeat from it yet
    TRAINING = "training"  # the trainer's heartbeat is fresh
    BACKOFF = "backoff"  # the trainer died; waiting before the next attempt
    WAITING_SPACE = "waiting_space"  # a checkpoint did not fit in scratch: pruning, syncing, waiting for room
    STOPPING = "stopping"  # the trainer finished, or a stop was asked (trainer told to save): the last sync
    DONE = "done"  # the budget is reached (or stopped on request) and the newest checkpoint synced
    FAILED = "failed"  # a final error: bad config or data, or the restart policy gave up


FIRST_HEARTBEAT = "first heartbeat from attempt"
"""How the reason of the TRAINING phase begins (`first heartbeat from attempt 2 (step 447)`): how it began, which
`minilmd status` shows as the phase going on once training has gone past that step (daemon/views/status.py)."""

FINAL_PHASES = frozenset({Phase.DONE, Phase.FAILED})
INITIAL_PHASES = frozenset({Phase.WAITING_INIT, Phase.WAITING_GPU})
"""Where a supervisor starts (first_phase): nothing reaches them but the start, or a transition of the table."""
LAUNCH_PHASES = frozenset({Phase.WAITING_SCRATCH})
"""The launch's own, before the supervisor's loop runs (daemon/scratchclaim.py, daemon/waitrecord.py): it holds the
run lock and writes state.json, and hands both over to the supervisor, whose start is then a transition from it."""
ATTEMPT_PHASES = frozenset({Phase.STARTING, Phase.TRAINING, Phase.BACKOFF})
"""A trainer runs, or is about to run again: the periodic sync and the pruning of scratch go on."""


def first_phase(init_pending: bool) -> Phase:
    """waiting_init when init.from names a run that has not finished (daemon/phases/initwait.py), else waiting_gpu."""
    return Phase.WAITING_INIT if init_pending else Phase.WAITING_GPU

# Every allowed transition and the name it is logged under. STOPPING and FAILED are reachable from every live phase.
TRANSITIONS: dict[tuple[Phase, Phase], str] = {
    (Phase.WAITING_INIT, Phase.WAITING_GPU): "init_ready",
    (Phase.WAITING_GPU, Phase.STAGING): "gpu_ready",
    (Phase.STAGING, Phase.STARTING): "staged",
    (Phase.STAGING, Phase.BACKOFF): "staging_failed",
    (Phase.STARTING, Phase.TRAINING): "first_heartbeat",
    (Phase.STARTING, Phase.BACKOFF): "child_died",
    (Phase.TRAINING, Phase.BACKOFF): "child_died",
    (Phase.BACKOFF, Phase.STARTING): "restart",
    (Phase.BACKOFF, Phase.STAGING): "restage",
    (Phase.BACKOFF, Phase.WAITING_GPU): "wait_for_gpu",
    (Phase.STAGING, Phase.WAITING_SPACE): "scratch_full",  # the launch's compile caches found no room
    (Phase.BACKOFF, Phase.WAITING_SPACE): "scratch_full",
    (Phase.STARTING, Phase.WAITING_SPACE): "scratch_full",
    (Phase.TRAINING, Phase.WAITING_SPACE): "scratch_full",
    (Phase.WAITING_SPACE, Phase.STARTING): "space_freed",
    (Phase.WAITING_SPACE, Phase.STAGING): "restage",
    (Phase.STOPPING, Phase.DONE): "stopped",
    (Phase.WAITING_SCRATCH, Phase.WAITING_INIT): "scratch_made",
    (Phase.WAITING_SCRATCH, Phase.WAITING_GPU): "scratch_made",
    (Phase.WAITING_SCRATCH, Phase.DONE): "stopped_waiting",  # nothing started: no trainer to save, nothing to sync
    (Phase.WAITING_SCRATCH, Phase.FAILED): "gave_up",
}
for _live in (Phase.WAITING_INIT, Phase.WAITING_GPU, Phase.STAGING, Phase.STARTING, Phase.TRAINING, Phase.BACKOFF,
              Phase.WAITING_SPACE):
    TRANSITIONS[(_live, Phase.STOPPING)] = "stopping"
    TRANSITIONS[(_live, Phase.FAILED)] = "gave_up"
TRANSITIONS[(Phase.STOPPING, Phase.FAILED)] = "gave_up"


class IllegalTransition(RuntimeError):
    pass


START = "start"
"""The one transition with no phase of this supervisor before it: its start into an INITIAL_PHASES phase (state.json's
phase is then the previous supervisor's record), or a launch's into LAUNCH_PHASES."""


def check_start(first: Phase, waited: bool = False) -> Phase:
    """The phase a supervisor starts in, checked to be one of INITIAL_PHASES (IllegalTransition if not): the start
    sets state.json's phase through this, every later change through check_transition. `waited`: the launch waited
    for scratch (waiting_scratch, LAUNCH_PHASES) and handed its run lock over: the start is that phase's transition."""
    if first not in INITIAL_PHASES:
        raise IllegalTransition(f"no {START} into {first}: a supervisor starts in {sorted(INITIAL_PHASES)}")
    if waited:
        check_transition(Phase.WAITING_SCRATCH, first)
    return first


def check_transition(current: Phase, new: Phase) -> str:
    """The transition's name, or IllegalTransition if the table does not allow it."""
    try:
        return TRANSITIONS[(current, new)]
    except KeyError:
        raise IllegalTransition(f"no transition {current} -> {new} in daemon/base/states.py") from None


class SyncState(Named):
    """state.json "sync.state": the copy of checkpoints to run.remote (daemon/jobs/syncworker.py)."""

    OFF = "off"  # no run.remote
    IDLE = "idle"  # a remote, no sync yet
    RUNNING = "running"  # a sync thread is copying
    OK = "ok"  # the last sync verified (or found nothing to sync)
    FAILED = "failed"  # the last sync failed; retried with backoff
    STALLED = "stalled"  # a running sync moved no byte for longer than MINILMD_SYNC_STALLED_AFTER
    UNAVAILABLE = "unavailable"  # the remote could not be read for a resume (daemon/jobs/stagingworker.py)


class StagingState(Named):
    """state.json "staging.state": the corpus copy into scratch and the fetch of a remote checkpoint."""

    NOT_STARTED = "not_started"
    RUNNING = "running"  # copying and verifying the corpus
    FETCHING = "fetching"  # staged; retrying the fetch of the newest remote checkpoint
    WAITING_REMOTE = "waiting_remote"  # staged; the remote could not be read, the fetch is retried after a backoff
    DONE = "done"
    FAILED = "failed"


class Action(Named):
    """What the restart policy (daemon/child/policy.py) decided after a trainer ended (restarts[].action)."""

    FINISH = "finish"  # the budget is reached: the last sync, then done
    STOP = "stop"  # stopped on request: the last sync, then done
    FAIL = "fail"  # final: exit with the decision's exit status
    RESTART = "restart"  # backoff, then launch again
    RESTAGE = "restage"  # backoff, stage the corpus again, then launch
    WAIT_GPU = "wait_gpu"  # backoff, then wait for a free GPU again
    WAIT_SPACE = "wait_space"  # make room in scratch, wait until a checkpoint fits, then launch (not a restart)


class Cause(Named):
    """Why a trainer ended, as daemon/child/process.py classifies it (the descriptions are child.CAUSES)."""

    DONE = "done"
    STOPPED = "stopped"
    CONFIG_ERROR = "config_error"
    DATA_ERROR = "data_error"
    CUDA_OOM = "cuda_oom"
    SIGBUS = "sigbus"
    OOM_KILL = "oom_kill"
    KILLED = "killed"
    HANG = "hang"
    SIGNAL = "signal"
    CRASH = "crash"
    SCRATCH_FULL = "scratch_full"
    RUN_DIR_FULL = "run_dir_full"
