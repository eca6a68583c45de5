"""The checkpoint root as the trainer made it at its start, pinned by device and inode (with the scratch above it):
a save into it finds out whether it is still that very directory, and none makes it again by path (ScratchGone).

Before (user9 finding 2), `rm -rf` of a run's scratch while it trained (a common way to free /dev/shm) let the
next save remake `checkpoints/` by path: a scratch without its owner record, corpus or lock, which the supervisor
synced from, then refused at the next start as "someone replaced it" (config error, final). Torch-free.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from minilmd.names import SCRATCH_OWNER, step_name


class ScratchGone(Exception):
    """The directory checkpoints are saved in (or the scratch above it) was removed, or another directory stands at
    its path, since the trainer began (`Pinned`): nothing is made again by path (a directory remade so holds no
    owner record, no corpus, no lock, and the supervisor would sync from it); the save is refused. `step`: the
    checkpoint refused (None: the root was already gone at the trainer's start)."""

    def __init__(self, root: Path, step: int | None, why: str):
        self.root, self.step, self.why = root, step, why
        refused = f"checkpoint {step_name(step)} not saved" if step is not None else "nothing can be saved"
        super().__init__(f"{why}: {refused}")


@dataclass(frozen=True)
class Pinned:
    """A checkpoint root as the trainer made it at its start: it and the directory above it (the scratch), by
    device and inode, so that a save finds out whether they are still those very directories."""

    root: Path
    dirs: tuple[tuple[Path, int, int], ...]
    marker: Path | None = None
    """The scratch's owner record, when it had one at the trainer's start (a claimed scratch always has)."""

    def gone(self) -> str | None:
        """Why the root is no longer the one pinned (removed, another directory there), or None. A scratch that is
        still the pinned directory but has lost its owner record was partly removed: an `rm -rf` of it that raced a
        save ("Directory not empty") leaves scratch/ and checkpoints/ standing while owner.json, corpus/ and
        trainer.lock are gone (fault11 F1); saving on into it kept a scratch no claim would take again."""
        for path, dev, ino in self.dirs:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return f"{path} is not there any more"
            if (st.st_dev, st.st_ino) != (dev, ino):
                return f"{path} is another directory now (device {st.st_dev}, inode {st.st_ino}; it was device " \
                       f"{dev}, inode {ino})"
        if self.marker is not None and not os.path.lexists(self.marker):
            return f"scratch's {SCRATCH_OWNER} is gone: part of {self.marker.parent} was removed"
        return None


def pin_root(root: str | os.PathLike, parents: bool) -> Pinned:
    """Make the checkpoint root (with `parents`: the directories above it too, for `minilmd train` by hand; without,
    under a supervisor, whose claimed scratch must be there) and pin it: ScratchGone when the directory above it is
    missing and may not be made."""
    root = Path(root)
    try:
        root.mkdir(parents=parents, exist_ok=True)
    except FileNotFoundError:
        raise ScratchGone(root, None, f"{root.parent} is not there at the trainer's start") from None
    dirs = []
    for path in (root.parent, root):
        st = os.lstat(path)
        dirs.append((path, st.st_dev, st.st_ino))
    marker = root.parent / SCRATCH_OWNER
    return Pinned(root, tuple(dirs), marker if os.path.lexists(marker) else None)
