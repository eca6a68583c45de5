"""The states a run's state.json records, as enums: the supervisor's phase (Phase), its sync's (SyncState) and its
staging's (StagingState). Their values are state.json's format: the strings the supervisor writes and every reader
(`minilmd status`, the overview, the Prometheus textfile, a later stage's init wait) compares with, by member, never
by a string written again (tests/test_state_names.py). The transitions between phases are the supervisor's
(daemon/base/states.py). Here, in the core, so that the core's readers of a run's end reach them too. Torch-free,
the stdlib's enum alone: `minilmd status` imports it.
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


class SyncState(Named):
    """state.json "sync.state": the copy of checkpoints to run.remote (daemon/jobs/syncworker.py)."""

    OFF = "off"  # no run.remote
    IDLE = "idle"  # a remote, no sync yet
    RUNNING = "running"  # a sync thread is copying
    OK = "ok"  # the last sync verified (or found nothing to sync)
    FAILED = "failed"  # the last sync failed; retried with backoff
    STALLED = "stalled"  # a running sync moved no byte for longer than MINILMD_SYNC_STALLED_AFTER
    UNAVAILABLE = "unavailable"  # the remote could not be read for a resume (daemon/jobs/stagingworker.py)
    NONE_VALID = "none_valid"  # the remote answers, but no checkpoint there verifies for a resume, and the run synced
    #                            there: staging waits for a valid one (daemon/jobs/remotewait.py), never step 0


SYNC_TROUBLE = (SyncState.FAILED, SyncState.STALLED, SyncState.UNAVAILABLE, SyncState.NONE_VALID)
"""The sync states whose error `minilmd status` and the overview show beside the state (a tuple: compared with the
plain strings read back from state.json by ==)."""


class StagingState(Named):
    """state.json "staging.state": the corpus copy into scratch and the fetch of a remote checkpoint."""

    NOT_STARTED = "not_started"
    RUNNING = "running"  # copying and verifying the corpus
    FETCHING = "fetching"  # staged; retrying the fetch of the newest remote checkpoint
    WAITING_REMOTE = "waiting_remote"  # staged; the remote could not be read, the fetch is retried after a backoff
    DONE = "done"
    FAILED = "failed"


REMOTE_UNAVAILABLE = "remote unavailable"
"""How the sync's error begins when run.remote does not answer: its root gone or not the directory this run synced
to, its share dead (daemon/jobs/sync.py), or the fetch could not read it (daemon/jobs/stagingfetch.py)."""


def remote_unanswered(sync_state: str, sync_error: str | None) -> bool:
    """Whether state.json's sync section says run.remote does not answer now (status's remote words, the overview's
    SYNC cell): the fetch could not read it (UNAVAILABLE), a sync blocks on it (STALLED), or the last sync found it
    gone (FAILED with REMOTE_UNAVAILABLE's error); a sync that failed otherwise (a full remote) had an answer."""
    if sync_state in (SyncState.UNAVAILABLE, SyncState.STALLED):
        return True
    return sync_state == SyncState.FAILED and (sync_error or "").startswith(REMOTE_UNAVAILABLE)


IN_PROGRESS = (SyncState.RUNNING, SyncState.STALLED, StagingState.RUNNING, StagingState.FETCHING,
               StagingState.WAITING_REMOTE)
"""The sync and staging states that say work goes on (a copy, a fetch, a wait that retries): only while a supervisor
runs to carry it on."""
INTERRUPTED = "interrupted"
"""How a reader shows one of IN_PROGRESS that no supervisor carries on (`shown_state`); never written to state.json."""


def shown_state(state: str, supervisor_alive: bool) -> str:
    """A sync's or staging's state as `minilmd status`, the overview and the Prometheus textfile show it: one of
    IN_PROGRESS written by a supervisor that no longer runs (killed, crashed, or exited mid-copy) is INTERRUPTED,
    never "running" of a run nothing runs for (fault10 F3: `not running (... killed or crashed)` above `sync:
    running`). The one rule: each reader passes its own liveness (status's and the overview's supervisor_alive,
    the textfile's `up`)."""
    return INTERRUPTED if not supervisor_alive and state in IN_PROGRESS else state
