"""A scratch of this run's removed while the run ran and another directory of the user's own made at its name since
(minilmd/scratch.py `_check_held`): the words of that refusal, which blame no stranger and say what the directory
holds, so that its user can tell what `rm -r` of it loses (user9 finding 2). Torch-free."""
from __future__ import annotations

from pathlib import Path

from minilmd.names import CHECKPOINTS


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
