"""What a checkpoint takes and what a filesystem has left, as the sync's pruning of scratch measures them
(daemon/jobs/syncworker.py `make_room`). Torch-free."""
from __future__ import annotations

import os
from pathlib import Path

from minilmd import names
from minilmd.untrusted import loads, read_bytes


def free_bytes(root: Path) -> int | None:
    """Bytes an unprivileged writer may still use on root's filesystem; None if it cannot be measured."""
    try:
        st = os.statvfs(root)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def checkpoint_bytes(path: Path) -> int | None:
    """A checkpoint's size from its manifest (one small read, no hashing); None if it has no readable one."""
    try:
        manifest_path = path / names.MANIFEST
        files = loads(read_bytes(manifest_path, max_bytes=names.MANIFEST_MAX_BYTES)).get("files") or {}  # untrusted
        return manifest_path.stat().st_size + sum(int(f.get("size") or 0) for f in files.values())
    except (OSError, ValueError, AttributeError, TypeError):  # Unreadable is a ValueError
        return None
