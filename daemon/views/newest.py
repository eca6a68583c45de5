"""What a run's own files say beyond its state.json, once no supervisor keeps that up to date.

A supervisor killed with SIGKILL leaves its trainer training (and `minilmd stop` lets that trainer save before it
ends it): state.json then stays at what the dead supervisor last copied in, while metrics.jsonl, the heartbeat and
scratch's checkpoints go on. `minilmd status` (its --json and the overview's rows too: `current`) and `stop`
(daemon/views/status.py, overview.py, stop.py) all take the newest checkpoint from here, so that they never disagree
on which step exists: the one rule is the supervisor's own (daemon/base/runstate.py `apply_progress`) over the
metrics lines and the heartbeat newer than state.json, then the checkpoint directories in scratch beside the newest
one known (a save not logged yet, or a metrics.jsonl that cannot be read). Everything is read as the views read
untrusted files: metrics.jsonl from its end, a regular file only (minilmd/logread.py `tail_lines`), every value retyped
(`StateJson.from_dict`), the scratch listing bounded, no link followed, and only in a scratch still the run's.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from minilmd import names
from minilmd.daemon.base.runstate import RunState, json_records, read_heartbeat
from minilmd.daemon.base.statesections import LocalCheckpoint, StateJson
from minilmd.daemon.views.pathlooks import Looks
from minilmd.logread import tail_lines
from minilmd.scratch_root import not_looked_in
from minilmd.untrusted import Unreadable, dir_names

METRICS_LINES = 400
"""How many of metrics.jsonl's last lines are read: the newest train, eval and checkpoint lines are among them."""


def caught_up(run_dir: Path, state: StateJson, owner: int | None, looks: Looks | None = None) -> StateJson:
    """state as the supervisor would have made it from what the trainer wrote after state.json was last written;
    state itself when the files say nothing newer. A copy: nothing is written. `owner`: the run's
    user, `looks`: the view's (newest_local)."""
    since = state.updated or 0.0
    records = [rec for rec in _metrics_tail(run_dir) if _newer(rec.get("time"), since) and _well_typed(rec)]
    beat = read_heartbeat(run_dir)
    if beat is not None and beat.mtime <= since:
        beat = None
    held = RunState(run_dir / names.STATE, state.to_dict())  # never saved: the supervisor's rule, on a copy
    held.apply_progress(records, beat)
    fresh = StateJson.from_dict(held.to_dict())  # metrics.jsonl is anyone's who can write run.dir: retyped
    fresh.local_checkpoint = newest_local(fresh.local_checkpoint, owner, looks)
    return fresh


def current(run_dir: Path, state: StateJson, alive: bool, owner: int | None,
            looks: Looks | None = None) -> StateJson:
    """state as the views show it (`status`, its --json, the overview's rows): state.json itself while a supervisor
    is alive (it copies the trainer's files in itself), `caught_up` once none is. `owner`: the run's user, as the
    reader judged it (status: its run directory's descriptor's owner; the overview: the registry entry's user);
    `looks`: the view's looks at the paths state.json names (pathlooks.py), which say what did not answer."""
    return state if alive else caught_up(run_dir, state, owner, looks)


def changed_sections(state: StateJson, shown: StateJson) -> dict:
    """The top-level keys of state.json (as the supervisor writes them) that `current` changed, with their new
    values: {} when the trainer's files said nothing newer. `status --json` lays them over the file as read, so its
    "state" keeps state.json's shape; whether any were is its "caught_up"."""
    was = state.to_dict()
    return {key: value for key, value in shown.to_dict().items() if value != was.get(key)}


def newest_local(local: LocalCheckpoint | None, owner: int | None = None,
                 looks: Looks | None = None) -> LocalCheckpoint | None:
    """The newest complete checkpoint in scratch: `local`, or a newer one saved beside it (its directory holds a
    manifest) that state.json has not seen, e.g. the save of an orphaned trainer `stop` let finish. Only in a scratch
    that is still the run's (scratch_root.not_looked_in): after a reboot another user may have made its names first,
    and a step he plants there is no checkpoint of the run (state.json's word alone is shown, as for a scratch gone).
    `owner`: the run's user (None: this user). The path is state.json's, its user's to write: looked at as
    pathlooks.py looks (bounded: a scratch that does not answer is `local` as recorded, said through `looks`), its
    checkpoints directory opened without following a link."""
    if local is None or not local.path:
        return local
    root = Path(local.path).parent
    return (looks or Looks()).look("scratch", root.parent, _newest_beside, local, root, owner, default=local)


def _newest_beside(local: LocalCheckpoint, root: Path, owner: int | None) -> LocalCheckpoint:
    """newest_local's look, in its bounded thread."""
    if not_looked_in(root.parent, owner):
        return local
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return local  # gone, or a link: no checkpoint of the run beside it
    try:
        newest = max(_saved_steps(fd), default=None)
        if newest is None or (local.step is not None and newest <= local.step):
            return local
        name = names.step_name(newest)
        try:
            saved_at: float | None = os.lstat(f"{name}/{names.MANIFEST}", dir_fd=fd).st_mtime
        except OSError:
            saved_at = None
    finally:
        os.close(fd)
    return LocalCheckpoint(step=newest, time=saved_at, path=str(root / name))


def _saved_steps(root_fd: int) -> list[int]:
    """The steps of the complete checkpoint directories in the directory open as root_fd (a link is not one); none
    when it cannot be listed, or holds more entries than untrusted.dir_names reads (a checkpoint root holds a
    handful)."""
    try:
        listed = dir_names(root_fd)
    except Unreadable:
        return []
    return [names.step_of(name) for name in listed
            if names.is_step_name(name) and _is(stat.S_ISDIR, name, root_fd)
            and _is(stat.S_ISREG, f"{name}/{names.MANIFEST}", root_fd)]


def _is(kind, name: str, dir_fd: int) -> bool:
    """Whether `name` in the directory dir_fd is of `kind` (stat.S_ISDIR...), itself no link (looked at, not
    followed; _saved_steps looks at a step's manifest only once the step is a directory, no link)."""
    try:
        return kind(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _metrics_tail(run_dir: Path) -> list[dict]:
    try:
        lines, _ = tail_lines(run_dir / names.METRICS, METRICS_LINES)
    except Unreadable:
        return []  # not a file the trainer wrote (a FIFO, a link): state.json alone
    return json_records(lines)


def _newer(t: object, since: float) -> bool:
    return _number(t) and t > since  # type: ignore[operator]


INTEGERS = ("step", "total_steps", "tokens_seen")
NUMBERS = ("loss", "lr", "tok_s", "step_time", "val_loss", "blocking_s")


def _well_typed(rec: dict) -> bool:
    """A line whose every field status shows has its type (a hand-made one with `"step": "lots"` is skipped whole,
    not half taken)."""
    return (all(rec.get(k) is None or (_number(rec[k]) and isinstance(rec[k], int)) for k in INTEGERS)
            and all(rec.get(k) is None or _number(rec[k]) for k in NUMBERS)
            and isinstance(rec.get("path") or "", str))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
