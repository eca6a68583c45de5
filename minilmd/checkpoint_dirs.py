"""Checkpoint roots as directories: which checkpoints a root holds, what LATEST and BEST name, setting a damaged one
aside, the debris of a writer that died. Nothing here reads a checkpoint's contents (minilmd/checkpoint.py
validates them), so this module imports no numpy: `minilmd status` and init.from's lineage find checkpoints through
it and stay fast. Torch-free.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from minilmd.names import (
    BEST,
    LATEST,
    MANIFEST,
    QUARANTINE,
    REASON_FILE,
    is_step_name,
    quarantine_name,
    step_of,
    tmp_owner_pid,
)


def read_latest(root: str | os.PathLike, pointer: str = LATEST) -> str | None:
    """The directory name `LATEST` (or another pointer file: BEST) points to, or None when there is none yet."""
    try:
        name = (Path(root) / pointer).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return name or None


def read_best(root: str | os.PathLike) -> str | None:
    """The directory name `BEST` points to (the lowest val loss of an early_stop run), or None."""
    return read_latest(root, BEST)


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Step directories holding a manifest, oldest first. Temporary and manifest-less ones do not exist here."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if is_step_name(p.name) and (p / MANIFEST).is_file()]
    return sorted(found, key=step_of)


def quarantine(ckpt_dir: str | os.PathLike, reason: str) -> Path:
    """Move a bad checkpoint aside to <root>/quarantine/<name>-<time>/ with a reason.txt; nothing is deleted."""
    ckpt_dir = Path(ckpt_dir)
    qdir = ckpt_dir.parent / QUARANTINE
    qdir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    n = 1
    while (dest := qdir / quarantine_name(ckpt_dir.name, stamp, n)).exists():
        n += 1
    os.rename(ckpt_dir, dest)
    (dest / REASON_FILE).write_text(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {reason}\n", encoding="utf-8")
    return dest


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_tmp(root: str | os.PathLike) -> list[Path]:
    """Remove `.tmp-*` directories left by a writer that died (its pid is gone, or is this process). Returns
    them. A temp directory of another live process is left alone: only one trainer writes a root at a time."""
    root = Path(root)
    if not root.is_dir():
        return []
    removed = []
    for p in root.iterdir():
        pid = tmp_owner_pid(p.name)
        if pid is None or not p.is_dir():
            continue
        if pid == os.getpid() or not _pid_alive(pid):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed
