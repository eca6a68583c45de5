"""Helpers for the tests of a run directory's files made hostile (test_hostile_run_files, and with a second user
test_hostile_run_files_users): such a file made, and `minilmd` run as a real process under a memory limit (a read of
/dev/zero would take the machine's memory otherwise) and a timeout (a hang fails the test instead of blocking it)."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

MEMORY_LIMIT = 2 << 30
"""Address space for each command: minilmd's views need a fraction; a read of /dev/zero hits it in seconds."""


def make_hostile(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "list":
        path.write_text("[1, 2, 3]\n")
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(64 << 30)  # sparse: 64 GiB of NULs that take no disk
    else:  # pragma: no cover - a typo in a test
        raise ValueError(kind)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def minilmd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`minilmd ARGS` as a real process, memory-limited; TimeoutExpired (a failure) if it hangs."""
    return subprocess.run([sys.executable, "-m", "minilmd.cli", *args], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_limit_memory, env={**os.environ, "OMP_NUM_THREADS": "1"})
