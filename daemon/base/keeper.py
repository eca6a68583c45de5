"""Whether anything is left to start a running supervisor again if it dies: the one rule `minilmd status` (a line)
and `status --json` ("unguarded", which the tmux launcher reads) ask.

A supervisor is started again by what started it: the tmux launcher's window loop, systemd, a Slurm requeue. Its
state.json records its parent (pid and start time, SupervisorInfo.parent_pid). Closing the tmux session
(`tmux kill-session`) hangs up the window loop, which dies, while the supervisor takes the SIGHUP as "reopen
supervisor.log" and trains on (user3 F2): a run nobody would start again after a crash, and nothing said so. Once
the recorded parent is proven gone (its pid not there, a zombie, or another process under it), the
supervisor was reparented, and whatever loop or shell started it cannot start it again. A unit's supervisor is
systemd's child and restarted by systemd (state.json names the unit): never said unguarded. Only this host's running
supervisor is judged (`alive`: daemon/base/seen.py's judgement); a record without a parent (an older minilmd's)
says nothing. Torch-free; reads /proc only."""
from __future__ import annotations

from minilmd.daemon.base.statesections import StateJson
from minilmd.proc_info import start_ticks_or_raise


def unguarded(state: StateJson, alive: bool) -> str | None:
    """Why nothing would start the running supervisor of `state` again if it died, in words; None when something
    may (its parent runs, systemd's unit) or it is not known (not running here, no parent recorded)."""
    sup = state.supervisor
    if not alive or sup.systemd_unit or not sup.pid or not sup.parent_pid or sup.parent_start_ticks is None:
        return None
    try:  # the supervisor seen here too: /proc mounted hidepid hides another user's processes, never "gone" then
        if start_ticks_or_raise(sup.pid) != sup.start_ticks or \
                start_ticks_or_raise(sup.parent_pid) == sup.parent_start_ticks:
            return None
    except (OSError, ValueError):  # not known (EMFILE, a torn read): never said gone
        return None
    return (f"unguarded: the process that started supervisor pid {sup.pid} (pid {sup.parent_pid}: a tmux "
            f"launcher's window, a shell) has ended (its tmux session closed, its terminal gone), so nothing starts "
            f"it again if it dies; the run goes on (`minilmd logs -f` follows it); to have a launcher guard it: "
            f"`minilmd stop`, wait for the stop, then start it again")
