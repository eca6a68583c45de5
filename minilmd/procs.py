"""A process's identity on this host: its pid and its start time (field 22 of /proc/PID/stat, in clock ticks
since boot). A pid alone is recycled; the two together name one process, so a record or a temporary name that
outlives its process (trainer.json, state.json's supervisor, an export's temporary copy) can tell its maker from a
later process that got the same pid. Linux only, as all of minilmd. Torch-free, standard library only.
"""
from __future__ import annotations

from pathlib import Path


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if it is gone or a
    zombie. Together with the pid it identifies a process: a recycled pid has another start time."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    rest = raw[raw.rfind(")") + 2:].split()  # the command name may contain spaces and parentheses
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[19])
