"""Whether anything is left to start a running supervisor again if it dies: the one rule `minilmd status` (a line)
and `status --json` ("unguarded", which the tmux launcher reads) ask.

A supervisor is started again by what started it: the tmux launcher's window loop, systemd, a Slurm requeue. Its
state.json records its parent (pid and start time, SupervisorInfo.parent_pid). Closing the tmux session
(`tmux kill-session`) hangs up the window loop, which dies, while the supervisor takes the SIGHUP as "reopen
supervisor.log" and trains on (user3 F2): a run nobody would start again after a crash, and nothing said so. The
proof that the recorded parent has ended is the supervisor's own /proc entry: its parent now is another process (it
was reparented, to init or a subreaper, when its starter exited), and whatever loop or shell started it cannot start
it again. Never the starter's entry: /proc mounted hidepid=2 hides another user's processes as if gone, and a
supervisor's starter may be one (`exec minilmd run` in an sbatch script is root's slurmstepd's child; su, sudo -u):
every such run was called unguarded. A unit's supervisor is systemd's child and restarted by systemd (state.json
names the unit): never said unguarded. Only this host's running supervisor is judged (`alive`: daemon/base/seen.py's
judgement); a record without a parent (an older minilmd's) says nothing. Torch-free; reads /proc only."""
from __future__ import annotations

from minilmd.daemon.base.statesections import StateJson
from minilmd.proc_info import GONE_STATES, stat_fields


def unguarded(state: StateJson, alive: bool) -> str | None:
    """Why nothing would start the running supervisor of `state` again if it died, in words; None when something
    may (its parent runs, systemd's unit) or it is not known (not running here, no parent recorded)."""
    sup = state.supervisor
    if not alive or sup.systemd_unit or not sup.pid or not sup.parent_pid:
        return None
    try:  # the supervisor's own entry, seen here (hidepid hides another user's: nothing said then)
        fields = stat_fields(sup.pid)
        if fields is None or fields[0] in GONE_STATES or int(fields[19]) != sup.start_ticks or \
                int(fields[1]) == sup.parent_pid:  # still its starter's child: that one runs
            return None
    except (OSError, ValueError):  # not known (EMFILE, EACCES, a torn read): never said gone
        return None
    return (f"unguarded: the process that started supervisor pid {sup.pid} (pid {sup.parent_pid}: a tmux "
            f"launcher's window, a shell) has ended (its tmux session closed, its terminal gone), so nothing starts "
            f"it again if it dies; the run goes on (`minilmd logs -f` follows it); to have a launcher guard it: "
            f"`minilmd stop`, wait for the stop, then start it again")
