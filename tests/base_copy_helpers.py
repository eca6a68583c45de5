"""What the LoRA base-copy tests share (tests/test_base_copy_*.py): a staged base, and a directory's files."""
from __future__ import annotations

import os
import shutil
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


def replace_whole(src: Path, dst: Path) -> None:
    """What another machine's writer does that replaces whatever stands at dst (as a push did before
    Remote.publish_unless_taken): the old entry renamed aside and deleted, src renamed in; plain renames, none of
    this process's fsio (whose renameat2 calls a test counts)."""
    aside = dst.with_name(dst.name + ".replaced-by-another")
    if os.path.lexists(dst):
        os.rename(dst, aside)
    os.rename(src, dst)
    shutil.rmtree(aside, ignore_errors=True)
