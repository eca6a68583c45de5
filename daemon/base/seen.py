"""Where a run's supervisor is, whether it runs, and how that is known: the one rule `minilmd status` (its head line,
a sync or staging it shows interrupted, the look at run.remote), the overview's rows, `minilmd logs --follow` and a
stage waiting for its init.from predecessor (daemon/phases/initwait.py) ask (`supervisor_seen`; in daemon/base, not
the views, so that the phases may ask it too).

- Another host's (state.json names a host that is not this one: a run directory on a share seen by two machines, a
  Slurm job's): not known dead from here, nor alive; said so, with when its state.json was written last (OTHER_HOST).
- This host's: its record, state.json's pid and start time, against /proc/PID/stat (readable by anyone: a recycled pid
  has another start time; a record of an earlier boot names no process: runstate.supervisor_runs_here), checked against
  the kernel's table of flocks (/proc/locks, readable by anyone: who holds its run lock, matched on the lock file's
  device and inode, the file looked at with an lstat, never opened, never locked). The lock file is its owner's alone
  (mode 0600, hostile10 F1): a teammate of a run shared with run.share "group" or "all" cannot open it, and before was
  told "cannot tell". Both agree: judged by the lock (LOCK), as when the table has the record's pid holding the lock
  though /proc hides it from us (hidepid: only the owner's processes can open the lock to hold it); where the table
  cannot be read, the lock file is not there as the run's owner made it, or the two disagree, the record alone is the
  judge, and the words say so (RECORD). But a record of a supervisor gone while another pid holds its run lock is not
  judged (alive None, `unjudged`): only the owner's processes can hold it (a supervisor that systemd or the user started
  again, before it wrote its state.json; one in another pid namespace), so neither "killed or crashed, start it again"
  nor "running" is known.

What is shown, never whom to signal: `minilmd stop` proves a process by its own rule (minilmd/procs.py). Torch-free.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from minilmd import lockfile
from minilmd.daemon.base.runstate import fmt_time, supervisor_runs_here
from minilmd.daemon.base.statesections import StateJson
from minilmd.names import LOCK as LOCK_FILE
from minilmd.perms import is_own_uid, user_words
from minilmd.proc_info import flock_holders_known
from minilmd.scratch_lost import other_host

LOCK = "lock"
RECORD = "record"
OTHER_HOST = "other host"


@dataclass(frozen=True)
class Seen:
    """A run's supervisor as seen from here. `alive`: True running, False known not to run, None not checkable here
    (another host's); `host`: that other host, shown ("" for this one); `how`: LOCK, RECORD or OTHER_HOST; `why`:
    why the lock did not judge (RECORD); `owner`: the run directory's owner (None: not known)."""

    alive: bool | None
    """None: another host's, or this host's not judged (`unjudged`)."""
    pid: int | None
    how: str
    host: str = ""
    why: str = ""
    last_seen: float | None = None
    owner: int | None = None

    @property
    def elsewhere(self) -> str | None:
        """The other host that runs (or ran) it, not checkable from here; None for this host's."""
        return self.host or None if self.how == OTHER_HOST else None

    @property
    def unjudged(self) -> str | None:
        """Why a supervisor of this host is neither running nor known gone ("pid N holds its run lock ..."): its
        record says gone, another pid holds its run lock; None otherwise."""
        return self.why if self.alive is None and self.how == LOCK else None

    def running_words(self) -> str:
        """"supervisor pid N running", its user named when not ours (a teammate's look), the record named when it
        judged."""
        whose = f" of {user_words(self.owner)}" if self.owner is not None and not is_own_uid(self.owner) else ""
        return f"supervisor pid {self.pid}{whose} running" + self.judged()

    def judged(self) -> str:
        """" (judged from its record, ...: why)" when the record alone judged; "" when the run lock did."""
        return f" (judged from its record, {STATE_WORDS}: {self.why})" if self.how == RECORD else ""

    def elsewhere_words(self, phase: str) -> str:
        """The head line's words of a supervisor on another host: where, when it was last seen, that here it cannot
        be checked (never "killed or crashed": nothing here knows)."""
        return (f"supervisor on host {self.host} (last seen {fmt_time(self.last_seen)} in {phase or '?'}): this "
                f"host cannot check it (`minilmd status` on {self.host} can)")


STATE_WORDS = "state.json's pid and start time against /proc"


def supervisor_seen(state: StateJson, run_dir: Path | None = None, dir_fd: int | None = None,
                    owner: int | None = None) -> Seen:
    """The rule (module docstring) for the supervisor `state` names; its run lock looked at in `dir_fd` (the run
    directory judged, runarg.open_run) or `run_dir`; neither given: the record alone. `owner`: the run directory's
    owner (the lock file must be theirs; named in the words when not ours)."""
    sup = state.supervisor
    if host := other_host(sup.host):
        return Seen(None, sup.pid, OTHER_HOST, host=host, last_seen=state.updated, owner=owner)
    alive = supervisor_runs_here(sup)
    if run_dir is None and dir_fd is None:
        return Seen(alive, sup.pid, RECORD, why="its run lock not looked at", last_seen=state.updated, owner=owner)
    holders, why = lock_table(run_dir, dir_fd, owner)
    if holders is not None and not alive and sup.pid in holders:  # its /proc entry hidden from us (hidepid)
        return Seen(True, sup.pid, LOCK, last_seen=state.updated, owner=owner)
    if holders is not None and (sup.pid in holders) == alive and (alive or not holders):
        return Seen(alive, sup.pid, LOCK, last_seen=state.updated, owner=owner)
    if holders and not alive:  # another than the record's: a supervisor started again before it wrote state.json?
        return Seen(None, sup.pid, LOCK, why=f"pid {', '.join(map(str, holders))} holds its run lock (a supervisor "
                                             f"starting?)", last_seen=state.updated, owner=owner)
    if holders is not None and not why:
        why = (f"the kernel's lock table has pid {', '.join(map(str, holders))} holding its run lock" if holders
               else "no process holds its run lock by the kernel's lock table")
    return Seen(alive, sup.pid, RECORD, why=why, last_seen=state.updated, owner=owner)


def lock_table(run_dir: Path | None, dir_fd: int | None, owner: int | None) -> tuple[list[int] | None, str]:
    """(the pids of this host that hold the run lock by the kernel's table, /proc/locks; None when that cannot be
    told, with why). The lock file is looked at with an lstat (no link followed, nothing opened: a teammate cannot
    open it), and must be a regular file of `owner`'s (when given) with one link: anything else there is not the
    lock its supervisor takes."""
    try:
        st = os.lstat(LOCK_FILE, dir_fd=dir_fd) if dir_fd is not None else os.lstat(Path(run_dir or ".") / LOCK_FILE)
    except FileNotFoundError:
        return [], ""  # none made, or a run older than its lock: no process holds it
    except OSError as e:
        return None, f"{LOCK_FILE}: {e.strerror or type(e).__name__}"
    if lockfile.problem(st, owner=lockfile.Whose.ANYONE if owner is None else owner):
        return None, f"{LOCK_FILE} is not a lock file its owner made"
    holders = flock_holders_known(st)
    return (holders, "") if holders is not None else (None, "the kernel's lock table cannot be read")
