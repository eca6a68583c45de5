"""The supervisor's environment knobs, in one place: how long a sync (or a staging read, or a remote fetch) may run
before status calls it stalled, how long a failing remote is waited for before scratch is pruned without a sync,
and how long a Slurm job's last sync may wait. Tests and impatient operators shorten them (docs/failure-modes.md).

Read once where the run starts (`minilmd run` and `run --check`: daemon/preflight.py), never at import: a value the
duration parser does not take ("2 min"), or one out of its range, is a config error naming the variable (exit 2),
not a traceback. Accepts what config durations accept (minilmd/config_sections.py `parse_duration`): 90, "90s",
"2m". Torch-free.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from minilmd import names
from minilmd.config_sections import parse_duration


@dataclass(frozen=True)
class Knob:
    env: str
    default_s: float
    min_s: float
    max_s: float


SYNC_STALLED_AFTER = Knob(names.SYNC_STALLED_AFTER_ENV, default_s=120.0, min_s=1.0, max_s=86400.0)
"""A sync or a staging read that moved nothing for this long (no byte, no answer), or a remote fetch running longer,
shows as stalled (it keeps running in its thread); a sync still stalled so when the run ends is the last sync stalled.
Below a second every healthy copy would be called stalled; past a day a hung mount would go unsaid."""
PRUNE_UNSYNCED_AFTER = Knob(names.PRUNE_UNSYNCED_AFTER_ENV, default_s=60.0, min_s=1.0, max_s=7 * 86400.0)
"""With the remote failing, scratch is pruned without a sync after max(2 x sync.every, this)."""
FINAL_SYNC_WAIT = Knob(names.FINAL_SYNC_WAIT_ENV, default_s=15 * 60.0, min_s=1.0, max_s=86400.0)
"""A Slurm job's last sync waits this long for room or for its owner record (daemon/slurm/lastsynccut.py
FINAL_SYNC_WAIT_S): the wait holds the whole allocation."""


@dataclass(frozen=True)
class Knobs:
    sync_stalled_after_s: float = SYNC_STALLED_AFTER.default_s
    prune_unsynced_after_s: float = PRUNE_UNSYNCED_AFTER.default_s
    final_sync_wait_s: float = FINAL_SYNC_WAIT.default_s


DEFAULTS = Knobs()
"""Every knob at its default (a part made without the environment's: tests)."""


def _seconds(knob: Knob, environ: Mapping[str, str], problems: list[str]) -> float:
    raw = environ.get(knob.env)
    if raw is None or raw.strip() == "":
        return knob.default_s
    try:
        seconds = parse_duration(raw)
    except ValueError as e:
        problems.append(f"{knob.env}={raw!r}: {e}")
        return knob.default_s
    if not knob.min_s <= seconds <= knob.max_s:
        problems.append(f"{knob.env}={raw!r}: must be between {knob.min_s:g}s and {knob.max_s:g}s "
                        f"(default {knob.default_s:g}s)")
        return knob.default_s
    return seconds


def problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per knob set to what cannot be used (for preflight's check); empty when all can."""
    found: list[str] = []
    _read(os.environ if environ is None else environ, found)
    return found


def read(environ: Mapping[str, str] | None = None) -> Knobs:
    """The knobs the environment sets, defaults elsewhere; ValueError naming each bad one (preflight has refused
    them before a supervisor reads them)."""
    found: list[str] = []
    knobs = _read(os.environ if environ is None else environ, found)
    if found:
        raise ValueError("; ".join(found))
    return knobs


def _read(environ: Mapping[str, str], found: list[str]) -> Knobs:
    return Knobs(sync_stalled_after_s=_seconds(SYNC_STALLED_AFTER, environ, found),
                 prune_unsynced_after_s=_seconds(PRUNE_UNSYNCED_AFTER, environ, found),
                 final_sync_wait_s=_seconds(FINAL_SYNC_WAIT, environ, found))
