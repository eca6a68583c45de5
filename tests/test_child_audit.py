"""The fresh-eyes audit of how the supervisor runs and restarts the trainer: real processes and signals."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from supervisor_helpers import env_for, events, state, wait_or_kill, write_config
from waiting import wait_until

pytestmark = pytest.mark.slow  # supervisors as real processes


def test_a_closed_ssh_session_does_not_end_the_run(tmp_path, corpus):
    """`minilmd run` started in an SSH session, its stdout the terminal (or `| tee`): the session closes, SIGHUP
    comes (taken as a log reopen) and every later echo of an event fails (EIO, EPIPE). Before, the first failed
    echo raised out of the loop: a supervisor crash, exit 1, the trainer killed; the run goes on to its end now."""
    config = write_config(tmp_path, corpus, remote=False, train={"max_steps": 60})
    proc = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "run", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env_for(FAKE_STEP_S="0.05"))
    run_dir = tmp_path / "s" / "run"
    wait_until(lambda: state(run_dir).get("phase") == "training", what="the trainer's first heartbeat")
    assert proc.stdout is not None
    proc.stdout.close()  # the terminal is gone: nobody reads the supervisor's stdout any more
    proc.send_signal(signal.SIGHUP)
    assert wait_or_kill(proc) == 0
    final = state(run_dir)
    assert final["phase"] == "done", final
    assert not [e for e in events(run_dir) if e["event"] == "crash"]
