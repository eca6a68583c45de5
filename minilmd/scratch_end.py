"""A run's scratch given back at its end: scratch is RAM (/dev/shm) on a shared server, held from the machine's other
users for as long as anything stays in it.

`give_back()` is the end of a finished run: once the remote holds the last checkpoint the scratch goes, and it stays
when the remote does not (the reference notes' rule: the /dev/shm copy goes only after the sync succeeded).
`give_back_unsaved()` is the end of a run stopped (or failed for good) before its first checkpoint, whose scratch
holds only copies. `release_inputs()` is the end of a run that failed for good with checkpoints: the staged copies
go, the checkpoints stay. Each removes only through minilmd/scratch.py's own rules (`ensure_held`: the directory this
process claimed; `remove_own`: this user's, marked for this run) and says what it did for the run's events.
Torch-free.
"""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from minilmd.names import CHECKPOINTS
from minilmd.place_rule import lstat_or_none
from minilmd.scratch import ScratchChanged, ScratchRefused, ensure_held, remove_own
from minilmd.untrusted import holds_any

SCRATCH_GONE_WHY = "removed at the run's end, or by a reboot"
"""Why a run's scratch checkpoint is not there when its run.remote holds its saves: the one home of these words, for
`status` (daemon/views/status.py) and `verify/sample/chat/export RUN_DIR` (minilmd/checkpoint_select.py)."""


def tree_bytes(path: Path) -> int:
    """Disk (or RAM) held by the files under `path`, links not followed (st_blocks, as du counts)."""
    total = 0
    for top, dirs, files in os.walk(path, followlinks=False):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
            except OSError:  # gone meanwhile
                pass
    return total


def release_inputs(scratch: Path, names: tuple[str, ...], run, keep: dict[str, str] | None = None) -> str | None:
    """The end of a run that failed for good (a final exit: nothing restarts it until its user does): remove the
    staged copies `names` (the corpus, the probe's val split: copies of prepared corpora that stay on their shares)
    from scratch, so that a dead run does not hold /dev/shm's RAM from the machine's other users for days. The
    checkpoints stay (the newest may not be synced), and each of `names` that `keep` names, with why (the corpus the
    last staging trained from because its share could not be read: the only copy within reach, and the next start
    would have to wait for the share; a LoRA base: without a remote, its staged copy may be the only one of the
    weights its adapters were trained on). Nothing with `run.keep_scratch`. Returns what was done, None
    when there was nothing to remove or keep."""
    if run.keep_scratch or lstat_or_none(scratch) is None:
        return None
    try:
        ensure_held(scratch)
    except (ScratchChanged, ScratchRefused) as e:
        return f"left {scratch} alone: {'; '.join(e.problems)}"
    removed, size, notes = [], 0, []
    for name in names:
        path = scratch / name
        st = lstat_or_none(path)
        if st is None:
            continue
        if keep and name in keep:
            notes.append(f"kept the staged {name} in {scratch}: {keep[name]}")
            continue
        if not stat.S_ISDIR(st.st_mode):  # only what staging makes there, a directory; never a link followed
            notes.append(f"{path} is not a directory: left alone")
            continue
        held = tree_bytes(path)
        try:
            shutil.rmtree(path)
        except OSError as e:
            notes.append(f"{path} could not be removed: {e}")
            continue
        removed.append(name)
        size += held
    if not removed and not notes:
        return None
    said = [f"removed the staged {', '.join(removed)} from {scratch} ({size / 1e6:,.1f} MB freed; the run failed "
            f"for good, its checkpoints stay)"] if removed else []
    return "; ".join(said + notes)


def give_back_unsaved(scratch: Path, run_dir: Path, run, ended: str = "stopped",
                      remote_step: int | None = None) -> str | None:
    """The end of a stopped run (or, `ended`="failed for good", a final failure) whose scratch holds no checkpoint
    (it ended before it trained, or before its first save; or before staging: its marker alone): remove the
    scratch, which holds nothing but its marker and copies (a staged corpus, a probe split, init.from's weights:
    each stays where it was staged from), so that it does not hold /dev/shm's RAM until the run is started again.
    Anything under checkpoints/ (a checkpoint, a save in progress, quarantine) keeps all of it, and so does
    `run.keep_scratch`: None, nothing to say. Only a scratch this process claimed (ensure_held), of this
    user and marked for this run (remove_own), is removed; else it is left and the answer says why.
    `remote_step`: the newest step the run has on run.remote (the supervisor's state), which the words name as
    untouched: a launch that ended before a checkpoint of its own lost none of the run's."""
    if run.keep_scratch or lstat_or_none(scratch) is None or holds_checkpoints(scratch):
        return None
    try:
        ensure_held(scratch)
    except (ScratchChanged, ScratchRefused) as e:
        return f"left {scratch} alone: {'; '.join(e.problems)}"
    why = f"the run {ended} before its first checkpoint" if remote_step is None else \
        f"this launch {ended} before writing a checkpoint of its own; the run's checkpoints on run.remote (newest " \
        f"step {remote_step}) are untouched"
    return _remove_said(scratch, run_dir, why)


def holds_checkpoints(scratch: Path) -> bool:
    """Whether scratch's checkpoint root holds anything, or is something other than a directory (left as it is)."""
    root = scratch / CHECKPOINTS
    st = lstat_or_none(root)
    if st is None:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return True
    try:
        return holds_any(root)
    except OSError:
        return True  # not known to be empty: kept


def give_back(scratch: Path, run_dir: Path, run) -> str:
    """The end of a run that finished with its last checkpoint synced: remove its scratch, unless `run.keep_scratch`
    or there is no `run.remote` (scratch then holds the only copy). `run` is the config's [run] section. Returns what
    was done, for the run's events (the reference notes' rule: the /dev/shm copy goes only after the sync succeeded;
    a failed last sync never reaches here and keeps it)."""
    if lstat_or_none(scratch) is None:
        return f"{scratch} is not there any more"
    if run.keep_scratch:
        return f"kept {scratch} (run.keep_scratch = true)"
    if not run.remote:
        return f"kept {scratch}: it holds the only copy of the checkpoints (no run.remote)"
    return _remove_said(scratch, run_dir)


def _remove_said(scratch: Path, run_dir: Path, why: str = "") -> str:
    """Remove a run's scratch at its end (remove_own: only this user's, marked for run_dir), said for the run's
    events: what it freed (after `why`, when given), or why it was left in place."""
    size = tree_bytes(scratch)
    problem = remove_own(scratch, run_dir)
    if problem:
        return f"left {scratch} in place: {problem}"
    freed = f"{size / 1e6:,.1f} MB freed"
    return f"removed {scratch}: {why} ({freed})" if why else f"removed {scratch}: {freed}"
