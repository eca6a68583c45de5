"""The supervisor's phases and the transitions allowed between them, in one table.

Like supervisord's process states: the main loop is the only place that changes phase, and every change goes
through `check_transition`, so a transition that is not in the table is a bug that fails loudly instead of a
state nobody thought about. Torch-free.
"""
from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    WAITING_GPU = "waiting_gpu"  # polling NVML until enough devices look free for stable_polls polls
    STAGING = "staging"  # copying/verifying the prepared corpus into scratch (and fetching a remote checkpoint)
    STARTING = "starting"  # the trainer is launched; no heartbeat from it yet
    TRAINING = "training"  # the trainer's heartbeat is fresh
    BACKOFF = "backoff"  # the trainer died; waiting before the next attempt
    STOPPING = "stopping"  # the trainer finished, or a stop was asked (trainer told to save): the last sync
    DONE = "done"  # the budget is reached (or stopped on request) and the newest checkpoint synced
    FAILED = "failed"  # a final error: bad config or data, or the restart policy gave up

    def __str__(self) -> str:
        return self.value


FINAL_PHASES = frozenset({Phase.DONE, Phase.FAILED})

# Every allowed transition and the name it is logged under. STOPPING and FAILED are reachable from every live phase.
TRANSITIONS: dict[tuple[Phase, Phase], str] = {
    (Phase.WAITING_GPU, Phase.STAGING): "gpu_ready",
    (Phase.STAGING, Phase.STARTING): "staged",
    (Phase.STAGING, Phase.BACKOFF): "staging_failed",
    (Phase.STARTING, Phase.TRAINING): "first_heartbeat",
    (Phase.STARTING, Phase.BACKOFF): "child_died",
    (Phase.TRAINING, Phase.BACKOFF): "child_died",
    (Phase.BACKOFF, Phase.STARTING): "restart",
    (Phase.BACKOFF, Phase.STAGING): "restage",
    (Phase.BACKOFF, Phase.WAITING_GPU): "wait_for_gpu",
    (Phase.STOPPING, Phase.DONE): "stopped",
}
for _live in (Phase.WAITING_GPU, Phase.STAGING, Phase.STARTING, Phase.TRAINING, Phase.BACKOFF):
    TRANSITIONS[(_live, Phase.STOPPING)] = "stopping"
    TRANSITIONS[(_live, Phase.FAILED)] = "gave_up"
TRANSITIONS[(Phase.STOPPING, Phase.FAILED)] = "gave_up"


class IllegalTransition(RuntimeError):
    pass


def check_transition(current: Phase, new: Phase) -> str:
    """The transition's name, or IllegalTransition if the table does not allow it."""
    try:
        return TRANSITIONS[(current, new)]
    except KeyError:
        raise IllegalTransition(f"no transition {current} -> {new} in daemon/states.py") from None
