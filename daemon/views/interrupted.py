"""A sync or staging that state.json says goes on, shown once its supervisor no longer runs (fault10 F3: status said
`not running (... killed or crashed)` and `sync: running` of a supervisor SIGKILLed in its final sync). The rule is
minilmd/run_states.py `shown_state` (the overview and the Prometheus textfile apply it too); these are status's words
for it: what it was doing when state.json was last written, and that `minilmd run` does it again. A supervisor of
another host (a Slurm job's, its run directory on a share) is not known dead from here: its states are shown as
written. Torch-free.
"""
from __future__ import annotations

from minilmd.daemon.base.runstate import fmt_time
from minilmd.daemon.base.seen import supervisor_seen
from minilmd.daemon.base.statesections import StateJson
from minilmd.run_states import INTERRUPTED, shown_state


def _gone(state: StateJson, alive: bool) -> bool:
    """Whether the supervisor is known not to run: not alive by status's look, and of this host (daemon/base/seen.py:
    one of another host is not checkable from here)."""
    return not alive and supervisor_seen(state).elsewhere is None


def sync_interrupted(state: StateJson, alive: bool) -> str | None:
    """`interrupted (was running at T when the supervisor ended; ...)` for a sync in progress that no supervisor
    carries on (T: state.json's last write, the last moment it is known to have run), with the error of a stalled
    one; None when the sync's own state is what to show."""
    sync = state.sync
    if shown_state(sync.state, not _gone(state, alive)) != INTERRUPTED:
        return None
    why = f": {sync.error}" if sync.error else ""
    return (f"{INTERRUPTED} (was {sync.state} at {fmt_time(state.updated)} when the supervisor ended{why}; "
            f"`minilmd run` syncs again)")


def staging_interrupted(state: StateJson, alive: bool) -> str | None:
    """The staging line for a staging (or a fetch, or its wait for the remote) in progress that no supervisor carries
    on, with what it waited for (a stalled or unreachable source: "waiting for it", "retrying" no more); None when
    staging's own lines are what to show."""
    staging = state.staging
    if shown_state(staging.state, not _gone(state, alive)) != INTERRUPTED:
        return None
    held = (f"{staging.stalled.what} not answering" if staging.stalled is not None
            else staging.waiting or staging.unreachable or staging.error)
    return (f"  staging: {INTERRUPTED} (was {staging.state} at {fmt_time(state.updated)} when the supervisor ended"
            f"{f': {held}' if held else ''}; `minilmd run` stages again)")
