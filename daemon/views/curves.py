"""A run's curves across all its attempts, from metrics.jsonl and events.jsonl: what `minilmd plot` draws and the
sparkline of `minilmd status` shows.

Every attempt appends to the same metrics.jsonl (the trainer opens it with "a": a resume never truncates it), so a
run killed at step 130 and resumed from its checkpoint at step 100 has two lines for steps 101-130. `last_per_step`
keeps one line per step, the one written last: the attempt that went on is the one whose weights the run kept.
Restarts come from the supervisor's events.jsonl (a trainer that ended other than done or stopped, and a supervisor
that started again: "supervisor" when the one before was killed, "stop" after a stop; a supervisor's start at the
step of the last line logged before it, in file order, a stop's at the checkpoint it saved), sync failures are the spans
from a failed (or stalled) sync to the next one that succeeded, and epoch boundaries are the steps where the "epoch"
of the train lines changes. Only the current lineage is read (daemon/base/timeline.py): after `minilmd run --fresh`
started a new one in this run.dir, what both files hold from before its start is another timeline's, left out and
said (`earlier_words`); a resume from an older checkpoint is the same lineage, its steps repeated. Torch-free and
matplotlib-free.
"""
from __future__ import annotations

import bisect
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

from minilmd import names
from minilmd.daemon.base import timeline
from minilmd.daemon.base.runstate import fmt_time, json_records, read_state
from minilmd.logread import stream_lines, tail_lines
from minilmd.untrusted import Unreadable

NOT_RESTARTS = ("done", "stopped")
"""Causes of a trainer's end that are no restart: the budget reached, a stop asked for."""
SYNC_FAILED_PREFIXES = ("sync failed", "the sync looks stalled")
"""How daemon/jobs/syncworker.py's "sync" events begin when a sync failed or stalled; "synced step" ends the span."""
SPARKS = "▁▂▃▄▅▆▇█"
PLOT_MAX_BYTES = 64 << 20
"""The most of metrics.jsonl or events.jsonl that `plot` reads, from its end: a run of a million steps logging each
one writes about 250 MiB, every 10th 25 MiB; a file someone made huge (or a sparse one of terabytes) is never read
whole, and what is read streams by one block at a time (logread.stream_lines)."""
PLOT_MAX_RECORDS = 50_000
"""The most records of each kind (a metrics line's "kind", an event's "event") that `plot` keeps: past that they are
thinned evenly as they stream by (every 2nd, then every 4th...; the last one always kept), so memory stays bounded
however many lines a file holds, and a curve of a million steps is drawn from 50,000 of them (more than the pixels)."""
PLOT_MAX_KINDS = 32
"""The most kinds kept apart when thinning; records of kinds beyond those share one group (a flood of made-up ones)."""
STATUS_METRICS_LINES = 20_000
"""How many of metrics.jsonl's last lines `minilmd status` reads (its epoch lines, fit warnings, early stop): a few
epochs of a long run, bounded whatever the file holds."""
STATUS_METRICS_MAX_BYTES = 8 << 20
"""The most of metrics.jsonl's end that status reads for those lines (real lines are about 300 bytes)."""


class _Thinned:
    """One kind's records: at most `cap`, evenly spaced over all of them, and the last one seen."""

    def __init__(self, cap: int):
        self.cap, self.stride, self.seen = cap, 1, 0
        self.kept: list[tuple[int, dict]] = []
        self.last: tuple[int, dict] | None = None

    def add(self, index: int, record: dict) -> None:
        if self.seen % self.stride == 0:
            self.kept.append((index, record))
            if len(self.kept) > self.cap:  # keep every other one: all kept are multiples of the doubled stride
                self.kept, self.stride = self.kept[::2], self.stride * 2
        self.seen += 1
        self.last = (index, record)


class Sample:
    """A bounded summary of a JSON-lines stream: each kind (the `key` field's value) thinned to PLOT_MAX_RECORDS
    (_Thinned), records() gives them back in file order. The last record of each kind is always among them, so a
    lineage marker, the last step and the last checkpoint are never thinned away."""

    def __init__(self, key: str, cap: int | None = None, max_kinds: int = PLOT_MAX_KINDS):
        self.key, self.max_kinds = key, max_kinds
        self.cap = PLOT_MAX_RECORDS if cap is None else cap
        self.groups: dict[object, _Thinned] = {}
        self.count = 0

    def add(self, record: dict) -> None:
        kind = record.get(self.key)
        kind = kind if isinstance(kind, str) and (kind in self.groups or len(self.groups) < self.max_kinds) else None
        self.groups.setdefault(kind, _Thinned(self.cap)).add(self.count, record)
        self.count += 1

    def kept(self) -> int:
        """How many records are held now (the bound tests check)."""
        return sum(len(g.kept) + 1 for g in self.groups.values())

    def records(self) -> list[dict]:
        held = dict(pair for g in self.groups.values() for pair in (*g.kept, g.last) if pair is not None)
        return [held[i] for i in sorted(held)]


def read_jsonl(path: Path, max_bytes: int = PLOT_MAX_BYTES, problems: list[str] | None = None,
               key: str = "kind") -> list[dict]:
    """The JSON objects of a JSON-lines file's last max_bytes ([] when missing), streamed and thinned per kind of
    `key` (Sample: bounded memory however big the file); a torn line (a writer killed mid-line) is skipped. A file
    that is not a regular one (a FIFO, a link) gives [] and its "NAME: unreadable (why)" in `problems`."""
    sample = Sample(key)
    try:
        for line in stream_lines(path, max_bytes):
            for record in json_records([line]):
                sample.add(record)
    except Unreadable as e:
        if problems is not None:
            problems.append(f"{path.name}: unreadable ({e.why})")
        return []
    return sample.records()


def read_recent(path: Path, lines: int = STATUS_METRICS_LINES, max_bytes: int = STATUS_METRICS_MAX_BYTES,
                problems: list[str] | None = None) -> list[dict]:
    """The JSON objects of a JSON-lines file's last `lines` lines, of at most its last max_bytes (status: bounded
    by lines, not thinned); [] and the problem said as read_jsonl does."""
    try:
        tail, _ = tail_lines(path, lines, max_bytes=max_bytes)
    except Unreadable as e:
        if problems is not None:
            problems.append(f"{path.name}: unreadable ({e.why})")
        return []
    return json_records(tail)


NUMERIC_KEYS = ("step", "time", "tokens_seen", "total_steps", "loss", "val_loss", "lr", "tok_s", "grad_norm",
                "step_time", "epoch")
"""The fields of a metrics or events line that are numbers; one that is not (a string, true) is dropped."""


def numbers_only(records: list[dict]) -> list[dict]:
    """records without the NUMERIC_KEYS whose value is not a number: a line someone wrote with "step": "x" is
    drawn without that field rather than failing the plot."""
    out = []
    for rec in records:
        bad = [k for k in NUMERIC_KEYS if k in rec and (isinstance(rec[k], bool)
                                                          or not isinstance(rec[k], (int, float)))]
        out.append({k: v for k, v in rec.items() if k not in bad} if bad else rec)
    return out


def last_per_step(records: list[dict]) -> list[dict]:
    """One record per step, sorted by step; of repeated steps (a resumed attempt) the one written last wins."""
    by_step: dict[int, dict] = {}
    for rec in records:
        if isinstance(rec.get("step"), int):
            by_step[rec["step"]] = rec
    return [by_step[s] for s in sorted(by_step)]


@dataclass
class Mark:
    """A restart: the step (and time) at which an attempt ended, and why."""

    step: float
    cause: str
    time: float


@dataclass
class Curves:
    """What is known of one run's course."""

    run_dir: Path
    name: str
    train: list[dict] = field(default_factory=list)
    logged: list[dict] = field(default_factory=list)
    """Every train line as written, all attempts in file order: where the run was at a time (a restart's step) is
    the line logged last before it, which a later attempt's line for the same step (in `train`) does not tell."""
    evals: list[dict] = field(default_factory=list)
    restarts: list[Mark] = field(default_factory=list)
    sync_failures: list[tuple[float, float]] = field(default_factory=list)
    """(first step, last step) of each span during which the sync was failing."""
    epochs: list[int] = field(default_factory=list)
    """Steps at which a new epoch of the training data began."""
    repeated_steps: int = 0
    """Train lines dropped because a later attempt logged the same step again."""
    unreadable: list[str] = field(default_factory=list)
    """"metrics.jsonl: unreadable (a FIFO)": the files that could not be read, so that what is drawn is not all."""
    earlier: timeline.Timeline = field(default_factory=timeline.Timeline)
    """Where the current lineage began (no records: those are `train` and the rest): its `run --fresh` start's time
    and the step the earlier timeline reached; fresh_since None when the run.dir holds one timeline only."""
    _clock: tuple[list[float], list[float]] | None = field(default=None, repr=False)
    """step_at's (times, steps) of the logged lines, made once."""

    def step_at(self, t: float) -> float:
        """The step the run had reached at time t: the last train line logged by t (0 before the first),
        interpolated towards the next one while the same attempt goes on (its step higher). Read from the lines as
        written, not one per step: after a resume from an earlier checkpoint the kept lines of the steps before t
        are the later attempt's, logged after t."""
        if self._clock is None:
            timed = [r for r in self.logged if isinstance(r.get("step"), (int, float)) and "time" in r]
            # a clock set back makes times go down in file order: each line counts as logged by the latest time so far
            self._clock = (list(itertools.accumulate((r["time"] for r in timed), max)), [r["step"] for r in timed])
        times, steps = self._clock
        i = bisect.bisect_right(times, t) - 1
        if i < 0:
            return 0.0
        if i + 1 == len(times) or steps[i + 1] <= steps[i] or times[i + 1] <= times[i]:
            return float(steps[i])
        return float(steps[i] + (steps[i + 1] - steps[i]) * (t - times[i]) / (times[i + 1] - times[i]))

    def tokens_at(self, step: float) -> float:
        """Tokens trained on at a step (interpolated between train lines)."""
        return _interp(step, [r["step"] for r in self.train], [r.get("tokens_seen", 0) for r in self.train])


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    if not xs:
        return 0.0
    i = bisect.bisect_left(xs, x)
    if i <= 0:
        return float(ys[0]) if x >= xs[0] else float(ys[0]) * (x / xs[0] if xs[0] else 1.0)
    if i >= len(xs):
        return float(ys[-1])
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0)) if x1 != x0 else float(y1)


def run_name(run_dir: Path, dir_fd: int | None = None) -> str:
    """The run's name in its state.json (read as daemon/base/runstate.py reads it; through `dir_fd`, the run
    directory judged, when given), else its directory's name."""
    name = (read_state(run_dir, dir_fd) or {}).get("run")
    return name if isinstance(name, str) and name else run_dir.name


def load(run_dir: str | os.PathLike, dir_fd: int | None = None) -> Curves:
    """The curves of the run in run_dir (its metrics.jsonl and events.jsonl; either may be missing). `dir_fd`: the
    run directory judged (daemon/views/runarg.py open_run), its files read through it; run_dir then only names it."""
    run_dir = Path(run_dir)
    reading = run_dir if dir_fd is None else Path(f"/proc/self/fd/{dir_fd}")  # the directory the descriptor holds
    problems: list[str] = []
    current = read_timeline(reading, problems)
    metrics = current.records
    raw_train = [r for r in metrics if r.get("kind") == "train"]
    curves = Curves(run_dir, run_name(run_dir, dir_fd), train=last_per_step(raw_train), logged=raw_train,
                    evals=last_per_step([r for r in metrics if r.get("kind") == "eval"]))
    curves.repeated_steps = len([r for r in raw_train if isinstance(r.get("step"), int)]) - len(curves.train)
    curves.earlier = timeline.Timeline([], current.earlier_step, current.fresh_since)
    events = timeline.events_since_fresh(numbers_only(read_jsonl(reading / names.EVENTS, problems=problems,
                                                                         key="event")))
    curves.unreadable = problems
    curves.restarts = _restarts(curves, events, [r for r in metrics if r.get("kind") == "checkpoint"])
    curves.sync_failures = _sync_failures(curves, events)
    epochs = [(r["step"], r["epoch"]) for r in curves.train if isinstance(r.get("epoch"), int)]
    curves.epochs = [step for (_, before), (step, e) in zip(epochs, epochs[1:], strict=False) if e != before]
    return curves


def read_timeline(run_dir: Path, problems: list[str] | None = None, recent: bool = False) -> timeline.Timeline:
    """metrics.jsonl's objects (read_jsonl's bounded, thinned read; with `recent` read_recent's last lines, as
    status reads them; numbers_only), cut at the last fresh start: the current lineage's records, and where it
    began."""
    path = run_dir / names.METRICS
    records = read_recent(path, problems=problems) if recent else read_jsonl(path, problems=problems)
    return timeline.current(numbers_only(records))


def earlier_words(current: timeline.Timeline) -> str | None:
    """"an earlier timeline (to step 1,330) is in this run.dir, before the run --fresh start of 2026-12-05
    09:01:32", or None when the run.dir holds one timeline only (no fresh start among what was read)."""
    if current.fresh_since is None:
        return None
    to = f" (to step {current.earlier_step:,})" if current.earlier_step is not None else ""
    when = f" of {fmt_time(current.fresh_since)}" if current.fresh_since else ""
    return f"an earlier timeline{to} is in this run.dir, before the run --fresh start{when}"


def _saved_by(checkpoints: list[dict], t: float) -> float | None:
    """The step of the last checkpoint line logged by time t (what `status` and `stop` call the local checkpoint:
    state.json's is the last such line), None when none was."""
    saved = [r["step"] for r in checkpoints if isinstance(r.get("step"), int) and r.get("time", t + 1) <= t]
    return float(saved[-1]) if saved else None


def _restarts(curves: Curves, events: list[dict], checkpoints: list[dict]) -> list[Mark]:
    """A trainer's end other than done or stopped, by its cause; and each supervisor start after the first, by how
    the one before ended: "supervisor" when it was killed or crashed (it wrote no "exit" event), "stop" after a
    clean exit of a stopped run, "exit N" after any other exit it wrote. A "stop" sits at the step the stop saved
    (the last checkpoint line of metrics.jsonl by that supervisor's exit: the step `minilmd stop` reported and the
    next attempt resumed from), not at the last train line logged before it, a few steps earlier."""
    marks = []
    starts = 0
    last_cause = ""
    previous_end = ""  # how the last supervisor ended, from its "exit" event; "" when it wrote none
    stopped_at: float | None = None  # the checkpoint a stopped supervisor's last trainer saved
    for ev in events:
        t = ev.get("time") or 0.0
        if ev.get("event") == "child_exit":
            last_cause = str(ev.get("cause"))
            if last_cause not in NOT_RESTARTS:
                step = ev.get("step")
                marks.append(Mark(float(step) if isinstance(step, (int, float)) else curves.step_at(t), last_cause,
                                  t))
        elif ev.get("event") == "exit":
            previous_end = "stop" if last_cause == "stopped" else f"exit {ev.get('exit')}"
            stopped_at = _saved_by(checkpoints, t) if previous_end == "stop" else None
        elif ev.get("event") == "start":
            starts += 1
            if starts > 1:  # a supervisor started again on this run dir
                step = stopped_at if stopped_at is not None else curves.step_at(t)
                marks.append(Mark(step, previous_end or "supervisor", t))
            previous_end, last_cause, stopped_at = "", "", None
    return marks


def _sync_failures(curves: Curves, events: list[dict]) -> list[tuple[float, float]]:
    spans = []
    failing_since: float | None = None
    for ev in events:
        if ev.get("event") != "sync":
            continue
        message = str(ev.get("message", ""))
        if message.startswith(SYNC_FAILED_PREFIXES):
            failing_since = ev.get("time") if failing_since is None else failing_since
        elif message.startswith("synced step") and failing_since is not None:
            spans.append((curves.step_at(failing_since), curves.step_at(ev.get("time") or failing_since)))
            failing_since = None
    if failing_since is not None:  # still failing: the span runs to the last logged step
        spans.append((curves.step_at(failing_since), float(curves.train[-1]["step"]) if curves.train else 0.0))
    return spans


def smooth(values: list[float], alpha: float = 0.1) -> list[float]:
    """An exponential moving average (TensorBoard's smoothing, debiased so that it starts at the first value)."""
    out, avg, weight = [], 0.0, 0.0
    for v in values:
        avg = avg * (1 - alpha) + v * alpha
        weight = weight * (1 - alpha) + alpha
        out.append(avg / weight)
    return out


def sparkline(values: list[float], width: int = 32) -> str:
    """values as block characters, one per bucket of the last `width` buckets, low to high."""
    if not values:
        return ""
    size = max(1, -(-len(values) // width))
    buckets = [sum(chunk) / len(chunk) for chunk in (values[i:i + size] for i in range(0, len(values), size))]
    low, high = min(buckets), max(buckets)
    span = (high - low) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int((v - low) / span * len(SPARKS)))] for v in buckets)


RECENT_LINES = 400
"""How many of metrics.jsonl's last lines the status sparkline reads: bounded, whatever the file's size."""


def recent_loss(run_dir: Path, lines: int = RECENT_LINES) -> list[dict]:
    """The last train lines of metrics.jsonl, one per step (read from its end: status stays fast), the current
    lineage's only (a fresh start's marker among them cuts them)."""
    try:
        tail, _ = tail_lines(run_dir / names.METRICS, lines)
    except Unreadable:
        return []  # not a file the trainer wrote (a FIFO, a link): no sparkline
    return last_per_step([rec for rec in timeline.current(json_records(tail)).records if rec.get("kind") == "train"
                          and isinstance(rec.get("loss"), (int, float)) and not isinstance(rec.get("loss"), bool)])


def sparkline_line(run_dir: Path, upto: int | None = None) -> str | None:
    """"  loss ▇▅▄▃▂▂▁▁ steps 100-500: 3.2100 -> 2.1000", or None when no train line was logged yet. No ETA here:
    the step line above it gives the run's one ETA (state.json's, as `status --all` does). `upto`: the step that
    line shows; lines of later steps (logged since state.json was written) are left out, so that both lines tell
    the run at one moment."""
    recs = [r for r in numbers_only(recent_loss(run_dir))
            if upto is None or (isinstance(r.get("step"), int) and r["step"] <= upto)]
    if not recs:
        return None
    losses = [float(r["loss"]) for r in recs]
    return (f"  loss {sparkline(losses)} steps {recs[0]['step']:,}-{recs[-1]['step']:,}: "
            f"{losses[0]:.4f} -> {losses[-1]:.4f}")
