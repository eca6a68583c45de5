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
before anything else (daemon/supervisor.py) and empties at its end. A lock nobody holds beside no state.json and no
events.jsonl is that: a supervisor that started and could write nothing (`could_not_start`, with run.dir's free
space now as the evidence of why), not a run that never started (user7 #5).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd import names, protocol
from minilmd.daemon.base.states import Phase
from minilmd.daemon.views.liveness import lock_supervisor_or_none
from minilmd.fsio import tail_lines
from minilmd.untrusted import MAX_LINE_DEPTH, Unreadable, clipped, loads

if TYPE_CHECKING:
    from minilmd.daemon.host.lock import LockInfo

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
    return f"starting (supervisor pid {holder.pid}{where})"


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def could_not_start(run_dir: Path, dir_fd: int | None = None) -> str | None:
    """Why a run directory without state.json could not start, when its run lock is there but no events.jsonl
    (module docstring; the caller has found no supervisor holding the lock): its free space now says whether it is
    full. None when that is not the case."""
    def there(name: str) -> bool:
        try:
            os.lstat(name if dir_fd is not None else run_dir / name, dir_fd=dir_fd)
            return True
        except FileNotFoundError:
            return False
        except OSError:
            return True  # there, but not looked into: no evidence either way
    if not there(names.LOCK) or there(names.EVENTS):
        return None
    try:
        st = os.fstatvfs(dir_fd) if dir_fd is not None else os.statvfs(run_dir)
        free: int | None = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    wrote = f"a supervisor took its run lock ({names.LOCK}) and could write nothing after it, not even {names.EVENTS}"
    if free == 0:
        return (f"could not start: run.dir is full (0 bytes free on its file system now): {wrote} (`minilmd run` "
                f"exits {protocol.SUPERVISOR_RUN_DIR_FULL} then); free space there, then start the run again")
    now = f"; {free:,} bytes free now" if free is not None else ""
    return f"could not start: {wrote} (was run.dir full or unwritable then? `minilmd run` said why{now})"


def no_state_lines(run_dir: Path, dir_fd: int | None = None) -> list[str]:
    """What `minilmd status RUN_DIR` says of a run directory without state.json (not escaped: printable() them):
    that a supervisor holding the run lock is starting; else how its last supervisor ended when events.jsonl
    records it, else that one could not start (could_not_start), else that none has started (or is just
    starting). `dir_fd`: the run directory judged (runarg.open_run), its lock and events.jsonl read through it;
    run_dir then only names it."""
    from minilmd.daemon.base.runstate import fmt_time, state_owners

    if (holder := lock_supervisor_or_none(run_dir, dir_fd)) is not None:
        return [f"{run_dir}: {_starting_words(holder)}; no state.json yet"]
    end = ended_in_events(run_dir if dir_fd is None else Path(f"/proc/self/fd/{dir_fd}"),
                          state_owners(run_dir, dir_fd))
    if end is None and (why := could_not_start(run_dir, dir_fd)):
        return [f"{run_dir}: {why}"]
    if end is None:
        return [f"{run_dir}: no state.json yet (the supervisor has not started here, or is just starting)"]
    at = f" at {fmt_time(end.time)}" if end.time is not None else ""
    return [f"{run_dir}: {end.words()}",
            f"  no {names.STATE}: its supervisor could not write one; this end is what its {names.EVENTS} "
            f"records{at}"]


def no_state_row(run_dir: Path, owner: int) -> dict:
    """The overview's row (daemon/views/overview.py) of a registered run directory without state.json: "starting",
    running, with "starting (supervisor pid N)" to show, while a supervisor holds its run lock; else "failed" with
    "events_exit" and "reason" when its events.jsonl (of `owner`, the entry's user) records that end, else "could
    not start" with "could_not_start" (could_not_start's words), else "not started"."""
    if (holder := lock_supervisor_or_none(run_dir)) is not None:
        return {"phase": "starting", "running": True, "starting": _starting_words(holder)}
    end = ended_in_events(run_dir, owner)
    if end is None and (why := could_not_start(run_dir)):
        return {"phase": "could not start", "ended": protocol.ENDED_FAILED, "running": False, "reason": why,
                "could_not_start": why}
    if end is None:
        return {"phase": "not started", "running": False}
    return {"phase": end.phase, "ended": protocol.ENDED_FAILED, "running": False, "reason": end.reason,
            "events_exit": end.exit}
