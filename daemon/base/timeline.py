"""Where the run.dir's current timeline (lineage) begins: the one home of the rule every view and the supervisor use.

Every attempt appends to the same metrics.jsonl and events.jsonl, so a run.dir holds the whole course of its run:
restarts, and resumes from an older checkpoint that log some steps again, are one lineage (daemon/views/curves.py
keeps the last line of a repeated step). `minilmd run --fresh` that starts from step 0 in a run.dir holding another
timeline (its checkpoints given up, daemon/jobs/stagingworker.py) begins a new lineage: what came before is no part
of this run's course. The supervisor marks it in both files before the new lineage's trainer starts:
- metrics.jsonl gets a line {"kind": "lineage", "lineage": "fresh", "earlier_step": N, "time": T} (`mark_fresh`),
  N the last train step logged before it (None when there was none);
- events.jsonl a "fetch" event with "lineage": "fresh" (daemon/jobs/remotewait.py counts records after it only).
`current` and `events_since_fresh` cut what a view read at the last marker it holds: a marker outside a bounded read
(the file's end only) means that all that was read is the current lineage's. A step lower than the one before it is
never read as a new lineage: only the marker is one. Torch-free.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from minilmd import names
from minilmd.jsonlines import LOG_UPDATE, append_whole, json_records, open_log, torn
from minilmd.logread import tail_lines
from minilmd.untrusted import Unreadable

MARKER_KIND = "lineage"
"""The "kind" of metrics.jsonl's fresh-start marker."""
FRESH = "fresh"
TAIL_LINES = 400
"""How many of metrics.jsonl's last lines `mark_fresh` reads for the step the earlier timeline reached."""


@dataclass(frozen=True)
class Timeline:
    """What a view read of metrics.jsonl, cut at the last fresh start it holds."""

    records: list[dict] = field(default_factory=list)
    """The current lineage's records, in file order."""
    earlier_step: int | None = None
    """The step the earlier timeline reached (the marker's word; None when there is no marker or it says none)."""
    fresh_since: float | None = None
    """When the current lineage began (the marker's time; 0.0 when it holds none); None when no marker was read."""


def is_marker(record: dict) -> bool:
    """A metrics.jsonl line that marks a fresh start."""
    return record.get("kind") == MARKER_KIND and record.get("lineage") == FRESH


def is_fresh_event(record: dict) -> bool:
    """An events.jsonl record that marks a fresh start (stagingworker's "fetch" event with lineage "fresh")."""
    return record.get("event") == "fetch" and record.get("lineage") == FRESH


def current(records: list[dict]) -> Timeline:
    """records (metrics.jsonl's, in file order) from after the last fresh-start marker among them."""
    last = next((i for i in range(len(records) - 1, -1, -1) if is_marker(records[i])), None)
    if last is None:
        return Timeline(records)
    marker = records[last]
    return Timeline(records[last + 1:], _int(marker.get("earlier_step")), _number(marker.get("time")) or 0.0)


def events_since_fresh(events: list[dict]) -> list[dict]:
    """events (events.jsonl's, in file order) from the start of the supervisor that began the current lineage on:
    the "start" event before the last fresh start's "fetch" event (that event itself where no start is before it
    among what was read). Its start is then the lineage's first, no restart; a later supervisor's is one."""
    last = next((i for i in range(len(events) - 1, -1, -1) if is_fresh_event(events[i])), None)
    if last is None:
        return events
    began = next((i for i in range(last, -1, -1) if events[i].get("event") == "start"), last)
    return events[began:]


def mark_fresh(run_dir: Path, time: float) -> None:
    """Append the fresh-start marker to the run's metrics.jsonl, after the step its last train line reached (read
    from the file's end, a regular file only); nothing when there is no metrics.jsonl or it is empty (no earlier
    timeline: a first run given --fresh). Opened as events.jsonl is (no link followed, no FIFO waited on); a torn
    last line (a trainer killed mid-line) is ended first, so the marker is a line of its own. Called while no
    trainer of the run runs (staging), so no line of one is torn by it. Raises OSError."""
    path = run_dir / names.METRICS
    try:
        tail, size = tail_lines(path, TAIL_LINES)
    except Unreadable:  # not a regular file: the open below says why
        tail, size = [], None
    if size == 0:
        return
    trained = [r for r in json_records(tail) if r.get("kind") == "train" and _int(r.get("step")) is not None]
    marker = {"kind": MARKER_KIND, "lineage": FRESH, "earlier_step": trained[-1]["step"] if trained else None,
              "time": round(time, 3)}
    fd = open_log(path, LOG_UPDATE | os.O_CREAT)  # read too: its last byte; a FIFO, a link: NotALog
    try:
        append_whole(fd, ((b"\n" if torn(fd) else b"") + json.dumps(marker).encode() + b"\n"))
    finally:
        os.close(fd)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
