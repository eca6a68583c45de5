"""The transitions allowed between the supervisor's phases, in one table, and the supervisor's own sub-states.

Like supervisord's process states: the main loop is the only place that changes phase, and every change goes
through `check_transition`, so a transition that is not in the table is a bug that fails loudly instead of a
state nobody thought about. The phases and the sub-states state.json records (Phase, SyncState, StagingState, their
base Named) live in minilmd/run_states.py, where the core reaches them too (Phase, imported here for the table, is
that same enum when imported from here).
The restart policy's action and the cause of a trainer's death are enums here; their values are the strings
events.jsonl and `minilmd status` show. Torch-free.
"""
from __future__ import annotations

from minilmd.run_states import Named, Phase

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
    (Phase.STAGING, Phase.WAITING_GPU): "gpu_lost",  # its card's lease lost to another run meanwhile: no launch there
    (Phase.WAITING_SPACE, Phase.WAITING_GPU): "gpu_lost",
    (Phase.STAGING, Phase.WAITING_SPACE): "scratch_full",  # the launch's compile caches found no room
    (Phase.BACKOFF, Phase.WAITING_SPACE): "scratch_full",
    (Phase.STARTING, Phase.WAITING_SPACE): "scratch_full",
    (Phase.TRAINING, Phase.WAITING_SPACE): "scratch_full",
    (Phase.WAITING_SPACE, Phase.STARTING): "space_freed",
    (Phase.WAITING_SPACE, Phase.STAGING): "restage",
    (Phase.STOPPING, Phase.DONE): "stopped",
    (Phase.STOPPING, Phase.STAGING): "restage",  # scratch removed before the last sync copied the last step (ending.py)
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
    """Why a trainer ended, as daemon/child/death.py classifies it (the descriptions are death.CAUSES)."""

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
