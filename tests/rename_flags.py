"""Whether renameat2's RENAME_EXCHANGE works where a test renames: a host whose libc lacks renameat2 (glibc < 2.28)
or whose tmp dir is on NFS (EINVAL) has minilmd fall back to plain renames, which a test of the flags cannot
check there."""
from __future__ import annotations

import shutil
from pathlib import Path

from minilmd import fsio


def exchange_not_done(where: Path) -> str | None:
    """Why RENAME_EXCHANGE cannot be tested in the directory `where` (None: it swaps two directories there)."""
    real = getattr(fsio, "renameat2", None)
    if real is None:
        return "minilmd.fsio has no renameat2"
    probe = where / ".renameat2-probe"
    a, b = probe / "a", probe / "b"
    for d in (a, b):
        d.mkdir(parents=True)
        (d / d.name).write_text(d.name)
    try:
        done = real(a, b, fsio.RENAME_EXCHANGE) and (a / "b").is_file() and (b / "a").is_file()
    except OSError as e:
        done, why = False, f"renameat2 fails here: {e}"
    else:
        why = f"renameat2's RENAME_EXCHANGE not done in {where} (no renameat2 in libc, or NFS)"
    shutil.rmtree(probe)
    return None if done else why
