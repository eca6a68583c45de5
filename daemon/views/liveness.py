"""Whether a run is alive, read from files its owner (or anyone) may have made: its state.json through the hardened
reader (daemon/base/runstate.py load_state: "unreadable (why)" rather than a hang or a traceback), its supervisor by pid
and start time, and, once that supervisor was killed, the trainer it left running (daemon/child/orphans.py, read
only) with the step of its heartbeat. For `minilmd status` and `stop` (daemon/views/status.py, stop.py), the overview.
Torch-free, light imports.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from minilmd.daemon.base.runstate import load_state, read_heartbeat
from minilmd.daemon.base.statesections import StateJson
from minilmd.fmt import fmt_duration
from minilmd.perms import owned_by_me
from minilmd.untrusted import Unreadable


def supervisor_alive(state: StateJson | None) -> bool:
    """Whether the supervisor state.json names runs: that process, by its pid and its start time, on this host. A
    pid alone is whichever process has it now (recycled, another user's); one of another host means nothing here
    (daemon/base/seen.py: its record alone, the run lock not looked at)."""
    from minilmd.daemon.base.seen import supervisor_seen

    return state is not None and supervisor_seen(state).alive is True  # the one rule: daemon/base/seen.py


def load(run_dir: Path, dir_fd: int | None = None) -> tuple[dict | None, str]:
    """(state.json, "") or (None, why it cannot be read: "a FIFO", "permission denied", ...); (None, "") when there
    is none yet. `dir_fd`: the run directory judged (runarg.open_run), read through it."""
    try:
        return load_state(run_dir, dir_fd), ""
    except Unreadable as e:
        return None, "" if e.missing else e.why


def trainer_alone(run_dir: Path, state: StateJson, alive: bool, dir_fd: int | None = None) -> list[int] | None:
    """After a supervisor was killed: the pids of the trainer it ran that still run (daemon/child/orphans.py, read
    only: the processes of ours that carry this run's launch id); None where nothing is looked at (a supervisor
    alive, a run that ended cleanly, another user's run: the orphan hunt sees only our own processes). `dir_fd`: the
    run directory judged (runarg.open_run): its owner, and its trainer record read through it."""
    if alive or state.outcome is not None:
        return None
    try:
        ours = owned_by_me(os.fstat(dir_fd) if dir_fd is not None else os.lstat(run_dir))
    except OSError:
        ours = False
    if not ours:
        return None
    from minilmd import procs
    from minilmd.daemon.child.orphans import find_orphans

    if dir_fd is None:
        return find_orphans(run_dir)
    try:
        return find_orphans(procs.scope_at(run_dir, dir_fd, None))
    except (procs.Refused, OSError):  # a link on its path now: no process can be proven the run's
        return []


def orphan_lines(run_dir: Path, state: StateJson, pids: list[int] | None, inside: Path | None = None) -> list[str]:
    """Whether the trainer a killed supervisor ran still runs (`pids`: trainer_alone's), with the step its
    heartbeat says (read in `inside` when given: the run directory judged, through its descriptor)."""
    if pids is None:
        return []
    if not pids:
        return ["  no trainer of this run is running"] if state.child else []
    beat = read_heartbeat(inside or run_dir)
    said = (f"heartbeat at step {beat[1]} {fmt_duration(time.time() - beat[0])} ago" if beat and beat[1] is not None
            else "no heartbeat step")
    return [f"  trainer still running without its supervisor: pid {', '.join(map(str, pids))} ({said}); "
            f"`minilmd stop {run_dir}` stops it (it saves first)"]


def lock_supervisor(run_dir: Path, dir_fd: int | None = None):
    """The holder of the run lock (daemon/host/lock.py LockInfo: pid, host, launch id), None when no process holds
    it: for `stop` (whom to signal) and `forget` (a running run stays listed). Never state.json's pid: anyone who can
    write the run directory writes that. OSError when the lock cannot be opened. `dir_fd`: the run directory judged
    (runarg.open_run), whose lock is opened through it."""
    from minilmd.daemon.host.lock import lock_holder

    holder = lock_holder(run_dir, dir_fd)
    return holder if holder is not None and holder.pid else None


def lock_supervisor_or_none(run_dir: Path, dir_fd: int | None = None):
    """lock_supervisor, None also where the lock cannot be opened: a run directory without state.json (lastwords.py:
    one starting) and one `forget` is given (gone is what it is for)."""
    try:
        return lock_supervisor(run_dir, dir_fd)
    except OSError:
        return None
