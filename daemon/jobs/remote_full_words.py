"""The words of a full remote (ENOSPC, EDQUOT on a sync's copy: a checkpoint's, or a LoRA run's base copy), with the
numbers of its latest try: what every sync says, the last sync's wait for room too (daemon/jobs/syncworker.py).
Torch-free.
"""
from __future__ import annotations

from minilmd.fmt import fmt_mb as mb


def full_words(remote_full: tuple[int | None, int | None] | None, inodes: int | None, of: str = "") -> str:
    """The one wording of a full remote: `remote_full` (the bytes the copy needs, the bytes free there; None: not
    known), `inodes` the remote's inode count when none was left (what ran out), else None; `of`: what found no
    room, when not a checkpoint ("the LoRA base's copy")."""
    needs, free = remote_full or (None, None)
    of = f" for {of}" if of else ""
    if inodes is not None:  # bytes to spare: freeing bytes would not help
        return f"remote full{of}: no inode left for a new file ({inodes:,} in all; {mb(free)} free)"
    return f"remote full{of} (needs {mb(needs)}, free {mb(free)})"


def full_why(cfg, remote_full: tuple[int | None, int | None] | None, inodes: int | None) -> str:
    """Why a remote that took one checkpoint may have no room for the next: the rule of sync.py (copied in full,
    then LATEST, then retention)."""
    keep = cfg.sync.keep
    needs = (remote_full or (None, None))[0]
    total = f", about {mb((keep + 1) * needs)} in all" if needs else ""
    if inodes is not None:
        return (f"{cfg.run.remote}'s file system has no inode left: a checkpoint needs a few new files and "
                f"directories; remove files there (any of its users') or ask for more inodes; the checkpoints "
                f"stay in scratch ({cfg.checkpoint_dir}) meanwhile")
    return (f"{cfg.run.remote} must hold a new checkpoint beside the ones it keeps (up to sync.keep = {keep} "
            f"of this run's): the new one is copied in full before the oldest is removed, so room for {keep + 1} "
            f"checkpoints{total}; free space there or lower sync.keep; the checkpoints stay in scratch "
            f"({cfg.checkpoint_dir}) meanwhile")
