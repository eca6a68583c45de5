"""What the LoRA base-copy tests share (tests/test_base_copy_*.py): a staged base, and a directory's files."""
from __future__ import annotations

import os
from pathlib import Path

from minilmd.daemon.jobs import initstage


def staged_pth(tmp_path: Path, name: str) -> Path:
    """A 4 KiB .pth base of random weights, staged (`<tmp_path>/<name>-scratch/init`)."""
    pth = tmp_path / f"{name}.pth"
    pth.write_bytes(os.urandom(4096))
    return initstage.stage_init(str(pth), tmp_path / f"{name}-scratch")


def files_of(root: Path) -> dict[str, bytes]:
    """Every regular file under root, by its path relative to root, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
