"""A corpus command held at a phase by tests/held_corpus_cli.py, then interrupted as a terminal's Ctrl-C does (SIGINT
to its whole process group): what the interrupt tests of prepare and corpus report/count share."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import procs
from waiting import wait_until

HELD_CLI = Path(__file__).with_name("held_corpus_cli.py")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def interrupt_at(tmp_path: Path, phase: str, argv: list[str], sig: int = signal.SIGINT) -> tuple[int, str]:
    """`minilmd ARGV` held at `phase`, its group SIGINTed there (another `sig`: the command alone, as `kill PID` or a
    closed SSH session's SIGHUP), then let go: (its exit status, its stderr), once every process of its group has
    ended. tmp_path gets `held/` and `stderr`."""
    held = tmp_path / "held"
    held.mkdir()
    with open(tmp_path / "stderr", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(HELD_CLI), *argv], stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True, env={**os.environ, "HELD_PHASE": phase, "HELD_DIR": str(held)})
        try:
            wait_until(lambda: (held / phase).exists() or proc.poll() is not None, 120, f"{argv[0]} to reach {phase}")
            assert proc.poll() is None, (tmp_path / "stderr").read_text()  # it ended before: a broken setup
            if sig == signal.SIGINT:
                assert procs.signal_child_group(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole group
            else:
                proc.send_signal(sig)
            (held / "go").touch()  # whatever holds there goes on, as it would have without the hold
            try:
                status = proc.wait(120)  # a bound on a hang, not a timing
            except subprocess.TimeoutExpired:
                pytest.fail(f"{signal.Signals(sig).name} at {phase} did not end {' '.join(argv[:2])}")
        finally:
            if proc.poll() is None:
                procs.signal_child_group(proc.pid, signal.SIGKILL)
                proc.wait()
    wait_until(lambda: not group_alive(proc.pid), 60, "every process of the command to end")
    return status, (tmp_path / "stderr").read_text()
