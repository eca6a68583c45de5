"""Real processes whose identity (pid and start ticks, minilmd/procs.py) a temporary name records: `sleeper`, one
that runs, and `dead`, one that ran and is gone, for the tests of leftover clean-ups (export, prepare)."""
from __future__ import annotations

import subprocess

import pytest

from minilmd.procs import process_start_ticks
from waiting import wait_until


@pytest.fixture
def sleeper():
    """A live process: (pid, start ticks); killed and reaped afterwards."""
    child = subprocess.Popen(["sleep", "600"])
    try:
        yield child.pid, wait_until(lambda: process_start_ticks(child.pid), 30, "the sleeper's start time")
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def dead() -> tuple[int, int]:
    """(pid, start ticks) of a process that ran and is gone, reaped: what a SIGKILLed maker's name records."""
    child = subprocess.Popen(["sleep", "600"])
    ticks = wait_until(lambda: process_start_ticks(child.pid), 30, "the process's start time")
    child.kill()
    child.wait()
    return child.pid, ticks
