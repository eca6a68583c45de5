"""A scratch of this run's removed while the run ran and another directory of the user's own made at its name since
(minilmd/scratch.py `_check_held`): the words of that refusal, which blame no stranger and say what the directory
holds, so that its user can tell what `rm -r` of it loses (user9 finding 2); and the claimed directory itself still
there but partly removed (`partly_removed`, fault11 F1), or not there as claimed at the run's end (`lost`, fault11
F2: daemon/ending.py stages again rather than call it "saved elsewhere"). Torch-free."""
from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from minilmd.dirtree import OPEN_DIR
from minilmd.names import CHECKPOINTS, SCRATCH_OWNER
from minilmd.perms import owned_by_me
from minilmd.untrusted import listed, printable


def remade_words(scratch: Path, before, now, newest: int | None) -> str:
    """Another directory of this user's where this run's was: the claimed one removed while the run ran (`rm -rf`
    to free /dev/shm) and one made since at its name (by hand, or by a trainer of an older minilmd, which made its
    `checkpoints` again by path). No stranger to blame: what it holds, so that its user can tell what `rm -r` loses."""
    held = f"its newest checkpoint is step {newest}" if newest is not None else "it holds no checkpoint"
    return (f"run.scratch {scratch} is not the directory this run claimed (device {before.dev}, inode {before.ino}): "
            f"that one was removed (or moved) while the run ran, and another directory of yours (device {now.dev}, "
            f"inode {now.ino}) stands at its name now, made or put there since; {held}; the run stops rather than "
            f"stage into, delete from or train in a directory it did not claim (final)")


def newest_step(scratch: Path) -> int | None:
    """The newest checkpoint step under a scratch of this user's (names only; a link or a stranger's step directory
    is none: checkpoint_dirs.list_checkpoints)."""
    from minilmd.checkpoint_dirs import local_checkpoint_steps

    return max(local_checkpoint_steps(scratch / CHECKPOINTS), default=None)


def lost(scratch: Path, before) -> str | None:
    """Why `scratch` is no longer this run's claimed directory as it was claimed (`before`: its Identity at the claim;
    None: this process claimed none there, and nothing is said): not there, another directory at its name, or that
    very directory without its owner record (partly removed: `partly_removed`). None: it is as claimed."""
    if before is None:
        return None
    try:
        st = os.lstat(scratch)
    except FileNotFoundError:
        return f"{scratch} is not there any more"
    if not _is_claimed(st, before):
        return f"{scratch} is another directory now (device {st.st_dev}, inode {st.st_ino}; the one claimed was " \
               f"device {before.dev}, inode {before.ino})"
    if _marker_gone(scratch):
        return f"{scratch} is the directory this run claimed, but its {SCRATCH_OWNER} is gone (partly removed)"
    return None


def partly_removed(scratch: Path, before) -> bool:
    """Whether `scratch` is the very directory this process claimed (`before`: its Identity then: device, inode;
    this user's) and its owner record is gone: an `rm -rf` of it that raced a checkpoint save ("Directory not empty")
    leaves scratch/ and checkpoints/ standing while owner.json, corpus/ and trainer.lock go (fault11 F1). What is left
    in it is this run's: the directory is the one it made or adopted and marked (0700, its user's), so the claim
    marks it again and the run stages again; nothing in it is deleted for it."""
    if before is None:
        return False
    try:
        st = os.lstat(scratch)
    except OSError:
        return False
    # owned_by_me: a claimed scratch is its user's
    return stat.S_ISDIR(st.st_mode) and _is_claimed(st, before) and owned_by_me(st) and _marker_gone(scratch)


def _is_claimed(st: os.stat_result, before) -> bool:
    """`st` (lstat of the scratch path now) is the directory claimed (`before`: its Identity then)."""
    return (st.st_dev, st.st_ino) == (before.dev, before.ino)


def _marker_gone(scratch: Path) -> bool:
    """The claimed directory's owner record is gone: what an `rm -rf` that raced a save leaves (partly removed)."""
    return not os.path.lexists(scratch / SCRATCH_OWNER)


def partly_removed_words(scratch: Path) -> str:
    return (f"run.scratch {scratch} was partly removed while the run trained (its {SCRATCH_OWNER} gone, the "
            f"directory itself still the one this run claimed: an `rm -rf` of it that raced a checkpoint save leaves "
            f"{CHECKPOINTS}/ behind): marked again, staging again")


def unmarked_words(scratch: Path, found: list[str]) -> str:
    """A scratch without a marker that holds `found` (names): refused, never emptied. A run's own scratch that an
    `rm -rf` removed only in part, after its supervisor has ended (no process knows it as the one it claimed any
    more), looks the same: said, with what to do when nothing in it is needed."""
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    part = f"; a scratch of this run's that an `rm -rf` only partly removed (one that raced a checkpoint save leaves " \
        f"{CHECKPOINTS}/ behind) looks so too: if nothing in it is needed (run.remote holds the run's checkpoints: " \
        f"`minilmd status` says its newest), remove {scratch} and start the run again" if CHECKPOINTS in found else ""
    return (f"run.scratch {scratch} already holds files ({shown}) and no {SCRATCH_OWNER}: minilmd adopts only an "
            f"empty directory or one marked for this run, since staging would replace or delete what is there{part}; "
            f"{'else ' if part else ''}set run.scratch to a new or empty directory")


def marker_only_words(scratch: Path, owner: dict) -> str | None:
    """Words for a scratch of another run that holds nothing but its marker (and perhaps an empty checkpoints/:
    nothing trained, nothing staged) and whose run.dir is gone from this host: a launch that failed at once (run.dir
    full, say) left it. Said with what to do; never removed here (this run did not make it). None otherwise: a
    record of another host, a run.dir still there, anything more in it, or a listing that fails, is the plain
    refusal. Bounded listings (untrusted.listed), no link followed."""
    if owner.get("host") != socket.gethostname() or os.path.lexists(owner["run_dir"]):
        return None
    try:
        found = set(listed(scratch)) - {SCRATCH_OWNER}
        if found - {CHECKPOINTS}:
            return None
        if found:  # checkpoints/: a real directory (OPEN_DIR: no link followed), and empty
            fd = os.open(scratch / CHECKPOINTS, OPEN_DIR | os.O_NONBLOCK)
            try:
                if listed(fd):
                    return None
            finally:
                os.close(fd)
    except OSError:
        return None
    return (f"run.scratch {scratch} holds only the marker of the run in {printable(owner['run_dir'])}, whose run.dir "
            f"is gone (a launch that never trained): remove {scratch} (`rm -r {scratch}`) or set run.scratch")
