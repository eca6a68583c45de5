"""procs.run_bounded: a command bounded in time ends with everything it started.

Before, py-spy (daemon/child/stackdump.py), dmesg (daemon/child/oomevidence.py) and scontrol/scancel
(daemon/slurm/job.py) ran under subprocess.run(timeout=) or a Popen killed by its pid: past the timeout only the
command itself was killed, and a process it had started lived on (house8 item 7). Real processes here: a shell that
starts a grandchild and waits for it; the grandchild's pid is read from a file the shell writes.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from minilmd import procs
from waiting import wait_until

SHELL_WITH_A_GRANDCHILD = 'sleep 600 & echo $! > "$1"; wait'


def test_past_its_timeout_the_commands_whole_group_is_killed_its_grandchild_too(tmp_path):
    """The shell and the sleep it started are both gone after the timeout (a zombie counts as gone: it runs
    nothing). Under load the shell may not have started its grandchild within a short bound: the bound is
    doubled until it has, so a slow machine slows the test, never fails it."""
    pid_file = tmp_path / "grandchild.pid"
    bound = 1.0
    while True:
        with pytest.raises(subprocess.TimeoutExpired):
            procs.run_bounded(["sh", "-c", SHELL_WITH_A_GRANDCHILD, "sh", str(pid_file)], bound, text=True)
        if pid_file.exists() and pid_file.read_text().strip():
            break
        assert bound < 64, "the shell never started its grandchild"
        bound *= 2
    grandchild = int(pid_file.read_text())
    wait_until(lambda: not procs.process_alive(grandchild), 60, "the grandchild killed with its group")


def test_a_command_that_ends_in_time_answers_as_subprocess_run_would():
    done = procs.run_bounded([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); "
                                                    "sys.exit(3)"], 60, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_a_command_that_cannot_start_is_an_oserror(tmp_path):
    with pytest.raises(OSError):
        procs.run_bounded([str(tmp_path / "no-such-program")], 60)
