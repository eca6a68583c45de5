"""How a run ended, from its events.jsonl, when it has no state.json: a supervisor that gave up before it could
write one (run.dir full at its first write of state.json: `minilmd run` exits 73) leaves its end in events.jsonl
alone. Without this, `minilmd status` said "no state.json yet (the supervisor has not started here ...)" and the
overview "not started" of a run that had failed, exit 73, saying why.

events.jsonl is read as state.json is: a regular file of the run directory's owner (or ours), no link followed,
only its last EVENTS_TAIL_BYTES, each line parsed with a bounded depth; what it says is shown escaped by the views.
Only the events after the last supervisor's "start" count, and none while a supervisor holds the run lock: a new
supervisor writes its "start" event only after the lock, its adopt notes, the remote's take-over and the orphan hunt
(daemon/supervisor.py), and until then it is shown "starting (supervisor pid N)", not ended by its predecessor's
words. Torch-free, light imports.

A run.dir with no room at all at launch leaves not even events.jsonl: only the run lock, which the supervisor makes
before anything else (daemon/supervisor.py) and empties at its end (user7 #5). The same files are left by a
supervisor killed in the seconds between its lock and its first event (its "start" comes after the take-over, the
init wait and the orphan hunt), and a lock held by one starting now looks alike while it writes its pid or where the
lock cannot be opened (another user's, mode 0600). So "could not start: run.dir is full" (`could_not_start`) is said
only on strict evidence: the lock provably free (opened, its flock taken), no events.jsonl, and 0 bytes free on
run.dir's file system now; a lock that cannot be opened (a teammate's look: the file is its owner's alone) is judged
by the kernel's lock table (/proc/locks, daemon/base/seen.py lock_table: the file lstat'ed, never opened), and only
where that cannot be read either is it "cannot tell"; else the older words, "no state.json yet" / "not started"
(review 9b #5).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd import names, protocol
from minilmd.daemon.base.states import Phase
from minilmd.logread import tail_lines
from minilmd.perms import run_dir_owner
from minilmd.untrusted import MAX_LINE_DEPTH, Unreadable, clipped, loads

if TYPE_CHECKING:
    from minilmd.daemon.host.lock import LockInfo
    from minilmd.dirfd import Dir

EVENTS_TAIL_BYTES = 256 << 10
"""The most of events.jsonl's end that is read: a supervisor's last events are a few lines, a few KB."""
EVENTS_TAIL_LINES = 200
"""The most of its last lines read: a supervisor writes a handful after its "start"."""
REASON_SHOWN = 4 << 10
"""The longest reason shown (ours are a few hundred characters; a longer one was not written by a supervisor)."""


@dataclasses.dataclass(frozen=True)
class EventsEnd:
    """A supervisor's end as events.jsonl records it: the phase it went to (failed), its exit status, why, when."""
    phase: str
    exit: int
    reason: str
    time: float | None

    def words(self) -> str:
        """"failed (exit 73): REASON", as `status` shows a run that ended."""
        return f"{self.phase} (exit {self.exit}): {self.reason}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def ended_in_events(run_dir: Path, owner: int | Collection[int]) -> EventsEnd | None:
    """The end events.jsonl records for the run's last supervisor: its "gave_up" transition into failed and its
    exit status (the transition's own, else its "exit" event's); None when there is none (the file missing, not
    `owner`'s, unreadable, or the last supervisor's events hold no such end: it runs, or was killed)."""
    try:
        lines, _ = tail_lines(run_dir / names.EVENTS, EVENTS_TAIL_LINES, EVENTS_TAIL_BYTES, owner=owner)
    except Unreadable:
        return None
    records = []
    for line in lines:
        try:
            records.append(loads(line, max_depth=MAX_LINE_DEPTH, expect=dict))
        except Unreadable:
            continue  # a torn line (a supervisor killed mid-write), or not ours
    start = max((i for i, r in enumerate(records) if r.get("event") == "start"), default=-1)
    ended, exit_status = None, None
    for record in records[start + 1:]:
        if record.get("event") == "gave_up" and record.get("new") == Phase.FAILED:
            ended, exit_status = record, _int(record.get("exit"))
        elif record.get("event") == "exit" and ended is not None and exit_status is None:
            exit_status = _int(record.get("exit"))
    if ended is None or exit_status is None:
        return None
    message = ended.get("message") if isinstance(ended.get("message"), str) else ""
    said = f"{ended.get('old')} -> {Phase.FAILED}: "  # the transition's words before its reason
    reason = message[len(said):] if message.startswith(said) else message
    when = ended.get("time")
    return EventsEnd(Phase.FAILED.value, exit_status, clipped(reason, REASON_SHOWN) or "no reason recorded",
                     float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else None)


def _starting_words(holder: LockInfo) -> str:
    import socket

    where = f" on {holder.host}" if holder.host and holder.host != socket.gethostname() else ""
    pid = f"pid {holder.pid}" if holder.pid else "pid not known yet"  # between its flock and its pwrite
    if holder.from_table:  # its lock file is its owner's alone: who holds it, by the kernel's record
        from minilmd.perms import is_own_uid, user_words
        from minilmd.proc_info import process_uids

        uids = process_uids(holder.pid) if holder.pid else None
        whose = f" of {user_words(uids[1])}" if uids and not is_own_uid(uids[1]) else ""  # a teammate's look
        return (f"starting (supervisor {pid}{whose}; seen holding its run lock in the kernel's lock table: "
                f"{names.LOCK} is its owner's alone)")
    return f"starting (supervisor {pid}{where})"


def _lock_now(run_dir: Path, dir_fd: int | None, owner: int | None = None) -> tuple[LockInfo | None, str]:
    """(the run lock's holder, its pid perhaps not written yet; None when none holds it or there is none) and why it
    cannot be looked at ("" when it can). Where it cannot be opened (another user's, mode 0600: a teammate's look at
    a run shared with run.share "group" or "all"), the kernel's lock table says who holds it (daemon/base/seen.py
    lock_table: the file lstat'ed, never opened), the holder a LockInfo of that pid, said to be seen so (`from_table`);
    only where that cannot be read either is it "cannot tell"."""
    from minilmd.daemon.host.lock import LockInfo, lock_look

    try:
        return lock_look(run_dir, dir_fd)[0], ""
    except OSError as e:
        unknown = e.strerror or type(e).__name__
    from minilmd.daemon.base.seen import lock_table

    holders, _ = lock_table(run_dir, dir_fd, owner)
    if holders is None:
        return None, unknown  # the table cannot say either: cannot tell
    if not holders:
        return None, ""  # no process of this host holds it
    return LockInfo(holders[0], "", None, from_table=True), ""


def _cannot_tell(unknown: str) -> str:
    return f"whether a supervisor holds its run lock cannot be told ({names.LOCK}: {unknown})"


def starting_holder(run_dir: Path, dir_fd: int | None = None) -> LockInfo | None:
    """Who holds the run lock of a run directory without state.json (`status --json`'s "starting_pid"): by the
    lock, or where it cannot be opened by the kernel's lock table (_lock_now); None when none is seen."""
    holder = _lock_now(run_dir, dir_fd, run_dir_owner(run_dir, dir_fd))[0]
    return holder if holder is not None and holder.pid else None


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def could_not_start(run_dir: Path, dir_fd: int | None = None) -> str | None:
    """Why a run directory without state.json (the caller's finding) could not start, on strict evidence (module
    docstring): its run lock there and provably free now, no events.jsonl, and 0 bytes free on its file system now:
    a supervisor that took the lock and could write nothing after it (`minilmd run` exit 73). None otherwise: a lock
    held, or that cannot be opened, or none; an events.jsonl; room now (then a supervisor killed before its first
    event leaves the same files)."""
    from minilmd.daemon.host.lock import lock_look

    try:
        free_lock = lock_look(run_dir, dir_fd)[1]
    except OSError:
        return None  # cannot tell: the caller says so
    if not free_lock:
        return None
    try:
        os.lstat(names.EVENTS if dir_fd is not None else run_dir / names.EVENTS, dir_fd=dir_fd)
        return None
    except FileNotFoundError:
        pass
    except OSError:
        return None  # there, but not looked into: no evidence
    try:
        st = os.fstatvfs(dir_fd) if dir_fd is not None else os.statvfs(run_dir)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize:
        return None
    return (f"could not start: run.dir is full (0 bytes free on its file system now): a supervisor took its run "
            f"lock ({names.LOCK}) and could write nothing after it, not even {names.EVENTS} (`minilmd run` exits "
            f"{protocol.SUPERVISOR_RUN_DIR_FULL} then); free space there, then start the run again")


def no_state_lines(run_dir: Path, dir_fd: int | None = None) -> list[str]:
    """What `minilmd status RUN_DIR` says of a run directory without state.json (not escaped: printable() them):
    that a supervisor holding the run lock is starting; else how its last supervisor ended when events.jsonl
    records it, else that one could not start (could_not_start), else that none has started (or is just
    starting). `dir_fd`: the run directory judged (runarg.open_run), its lock and events.jsonl read through it;
    run_dir then only names it."""
    from minilmd.daemon.base.runstate import fmt_time, state_owners

    holder, unknown = _lock_now(run_dir, dir_fd, run_dir_owner(run_dir, dir_fd))
    if holder is not None:
        return [f"{run_dir}: {_starting_words(holder)}; no state.json yet"]
    end = ended_in_events(run_dir if dir_fd is None else Path(f"/proc/self/fd/{dir_fd}"),
                          state_owners(run_dir, dir_fd))
    if end is None and unknown:
        return [f"{run_dir}: no state.json yet, and {_cannot_tell(unknown)}: one may be starting, or none has"]
    if end is None and (why := could_not_start(run_dir, dir_fd)):
        return [f"{run_dir}: {why}"]
    if end is None:
        return [f"{run_dir}: no state.json yet (the supervisor has not started here, or is just starting)"]
    at = f" at {fmt_time(end.time)}" if end.time is not None else ""
    return [f"{run_dir}: {end.words()}",
            f"  no {names.STATE}: its supervisor could not write one; this end is what its {names.EVENTS} "
            f"records{at}"] + [f"  {_cannot_tell(unknown)}: a supervisor starting now would not show"] * bool(unknown)


def no_state_row(run: Dir, owner: int) -> dict:
    """The overview's row (daemon/views/overview.py) of a registered run directory without state.json: "starting",
    running, with "starting (supervisor pid N)" to show, while a supervisor holds its run lock; else "failed" with
    "events_exit" and "reason" when its events.jsonl (of `owner`, the entry's user) records that end, else
    "unreadable" with "why" when its lock cannot be opened (cannot tell), else "could not start" with
    "could_not_start" (could_not_start's words, on its strict evidence), else "not started"."""
    holder, unknown = _lock_now(run.path, run.fd, owner)
    if holder is not None:
        return {"phase": "starting", "running": True, "starting": _starting_words(holder)}
    end = ended_in_events(run.inside, owner)
    if end is None and unknown:
        return {"phase": "unreadable", "running": False, "why": f"{names.LOCK}: {unknown}: cannot tell if starting"}
    if end is None and (why := could_not_start(run.path, run.fd)):
        return {"phase": "could not start", "ended": protocol.ENDED_FAILED, "running": False, "reason": why,
                "could_not_start": why}
    if end is None:
        return {"phase": "not started", "running": False}
    return {"phase": end.phase, "ended": protocol.ENDED_FAILED, "running": False, "reason": end.reason,
            "events_exit": end.exit}
