"""Ctrl-C in `minilmd corpus report` and `corpus count` while their reading workers start, or read, says one line
and exits 130, as prepare's does (tests/test_prepare_interrupt_phases.py). Before, their pool (scan.py) was started
the old way: the group's SIGINT raised KeyboardInterrupt in the workers as they started (a traceback from
multiprocessing's spawn_main in each), and the command itself said nothing (typer's handler: 130 without a word).
The pool is now started by minilmd/corpus/workers.py's one way: workers spawned with the stop signals held that
ignore Ctrl-C first thing. A real process group gets SIGINT, as a terminal sends it, at each moment
tests/held_corpus_cli.py holds the command at. The pool's workers also die with the command now (PR_SET_PDEATHSIG):
one killed with SIGKILL left them reading their shards."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from held_interrupt import HELD_CLI, interrupt_at
from waiting import wait_until

COMMANDS = {"report": ["corpus", "report"], "count": ["corpus", "count", "的"]}

pytestmark = pytest.mark.slow  # a real command and its workers in subprocesses


@pytest.mark.parametrize("phase", ["worker-start", "scan"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_ctrl_c_while_report_or_count_workers_start_or_read_says_one_line(tmp_path, corpus, command, phase):
    status, said = interrupt_at(tmp_path, phase, [*COMMANDS[command], str(corpus[0]), "--workers", "2"])
    lines = [line for line in said.splitlines() if line.strip()]
    assert (status, lines) == (130, [f"corpus {command}: interrupted"]), said


@pytest.mark.parametrize(("command", "sig"), [("count", signal.SIGTERM), ("report", signal.SIGHUP)])
def test_sigterm_or_sighup_while_report_or_count_read_acts_as_ctrl_c(tmp_path, corpus, command, sig):
    """`kill PID`, or the SSH session closed: before, either killed the command without a word (typer's handler
    caught only Ctrl-C); now each command takes them as prepare and export do (minilmd/corpus/exits.py
    interruptible)."""
    status, said = interrupt_at(tmp_path, "scan", [*COMMANDS[command], str(corpus[0]), "--workers", "2"], sig)
    lines = [line for line in said.splitlines() if line.strip()]
    assert (status, lines) == (130, [f"corpus {command}: interrupted"]), said


def test_sigkill_of_corpus_count_takes_its_reading_workers_with_it(tmp_path, corpus):
    held = tmp_path / "held"
    held.mkdir()
    proc = subprocess.Popen([sys.executable, str(HELD_CLI), *COMMANDS["count"], str(corpus[0]), "--workers", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "HELD_PHASE": "scan", "HELD_DIR": str(held)})
    workers: list[psutil.Process] = []
    try:  # held reading a shard: without the parent's death signal a worker would read on, whatever its parent
        wait_until(lambda: (held / "scan").exists() or proc.poll() is not None, 120, "count's workers to read")
        assert proc.poll() is None, "corpus count ended before it could be killed"
        workers = [p for p in psutil.Process(proc.pid).children() if "multiprocessing.spawn" in " ".join(p.cmdline())]
        assert workers, "no worker process found"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        wait_until(lambda: not [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], 60,
                   "count's workers to end after its SIGKILL")
    finally:
        for p in workers:
            if p.is_running():
                p.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
