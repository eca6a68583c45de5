"""The run lock with real processes: a second supervisor is refused with who holds it; a dead holder's lock is
taken over; a trainer child never inherits it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from minilmd.daemon.host.lock import LockHeld, RunLock, lock_holder

HOLDER = textwrap.dedent("""
    import subprocess, sys, time
    from minilmd.daemon.host.lock import RunLock
    RunLock(sys.argv[1]).acquire()
    if len(sys.argv) > 2:  # start a long-lived child, as the supervisor starts the trainer
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(child.pid, flush=True)
    print("locked", flush=True)
    time.sleep(60)
""")


def start_holder(run_dir, with_child=False):
    args = [sys.executable, "-c", HOLDER, str(run_dir)] + (["child"] if with_child else [])
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    child_pid = int(proc.stdout.readline()) if with_child else None
    assert proc.stdout.readline().strip() == "locked"
    return proc, child_pid


def kill(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()


def test_second_lock_in_the_same_process_is_refused(tmp_path):
    first = RunLock(tmp_path / "run")
    first.acquire()
    with pytest.raises(LockHeld) as err:
        RunLock(tmp_path / "run").acquire()
    assert err.value.pid == os.getpid()
    assert err.value.host == os.uname().nodename
    assert err.value.since is not None and abs(err.value.since - time.time()) < 60
    assert f"pid {os.getpid()}" in str(err.value)
    assert lock_holder(tmp_path / "run").pid == os.getpid()
    first.release()
    assert lock_holder(tmp_path / "run") is None
    assert (tmp_path / "run" / "supervisor.lock").read_text() == ""  # a clean release leaves no stale owner
    with RunLock(tmp_path / "run") as again:
        assert again.held


def test_live_holder_in_another_process_is_reported(tmp_path):
    proc, _ = start_holder(tmp_path)
    try:
        with pytest.raises(LockHeld) as err:
            RunLock(tmp_path).acquire()
        assert err.value.pid == proc.pid
        assert lock_holder(tmp_path).pid == proc.pid
    finally:
        kill(proc)


def test_lock_of_a_dead_supervisor_is_taken_over(tmp_path):
    proc, _ = start_holder(tmp_path)
    kill(proc)
    # The body still names the dead process, but nobody holds the flock.
    assert json.loads((tmp_path / "supervisor.lock").read_text())["pid"] == proc.pid
    assert lock_holder(tmp_path) is None
    lock = RunLock(tmp_path)
    lock.acquire()
    assert lock.held
    assert json.loads((tmp_path / "supervisor.lock").read_text())["pid"] == os.getpid()
    lock.release()


def test_child_of_a_dead_supervisor_does_not_keep_the_lock(tmp_path):
    proc, child_pid = start_holder(tmp_path, with_child=True)
    try:
        kill(proc)
        os.kill(child_pid, 0)  # the orphaned child still runs...
        with RunLock(tmp_path) as lock:  # ...yet the run can be taken over
            assert lock.held and lock_holder(tmp_path).pid == os.getpid()
    finally:
        os.kill(child_pid, signal.SIGKILL)


def test_lock_holder_on_a_directory_that_is_not_a_run(tmp_path):
    assert lock_holder(tmp_path / "nothing-here") is None
    assert not (tmp_path / "nothing-here").exists()
