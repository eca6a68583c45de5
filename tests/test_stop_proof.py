"""`minilmd stop` signals only a process proven to be the run's (minilmd/procs.py), never one a file names.

The attack (issue 40): a second user writes a run directory of his own whose state.json, or the body of a
supervisor.lock he holds, names a process of the victim by its pid and start time (both public in /proc): her
unrelated `sleep`, then her live training supervisor. Before, her `minilmd stop <his dir>` sent SIGTERM to it (the
process was hers, nothing else was checked) and her real run ended "stopped on request"; as root, the same killed a
root process he chose. Now a run directory of another user is refused by `stop` with its owner named, and root signals
only a process of the directory's owner that holds the run's lock and carries the run's identity in its environment.
Her genuine `minilmd stop` of her own run, and root's of her run, still stop it.

Real users: the victim is `nobody` (tests/second_user.py) running a real `minilmd run` (its trainer a sleeper that
saves nothing and exits 75 on SIGTERM, as a trainer does) and a `sleep`; the attacker is a second uid with no name
(setpriv needs no passwd entry), whose attack is a script run as him.
"""
from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minilmd import names, protocol
from minilmd.daemon.base.runstate import new_state, process_alive, process_start_ticks, read_state
from second_user import second_user, shared  # noqa: F401  (shared: the fixture)
from stop_victim import ATTACKER, as_attacker, python_argv, stop_as, victim  # noqa: F401  (victim: the fixture)

pytestmark = [pytest.mark.root, pytest.mark.slow]

ATTACK = """
import fcntl, os, sys, time
run_dir, state, lock_body = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(run_dir, exist_ok=True)
with open(os.path.join(run_dir, "state.json"), "w") as f:
    f.write(state)
if lock_body:  # a lock of his own run, held, whose body names her process
    fd = os.open(os.path.join(run_dir, "supervisor.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, lock_body.encode())
print("ready", flush=True)
time.sleep(600)
"""


class Attacker:
    """His run directory in the shared directory, its state.json (and a held lock) naming a process of hers."""

    def __init__(self, shared: Path, pid: int, ticks: int, with_lock: bool):
        self.run_dir = shared / f"evil-{pid}-{int(with_lock)}"
        state = new_state("evil", self.run_dir, str(shared / "evil.toml"))
        state.update(phase="training", supervisor={"pid": pid, "start_ticks": ticks, "host": socket.gethostname()})
        body = json.dumps({"pid": pid, "host": socket.gethostname(), "since": time.time()}) if with_lock else ""
        self.proc = subprocess.Popen(as_attacker([*python_argv(ATTACK), str(self.run_dir), json.dumps(state),
                                                  body]), stdout=subprocess.PIPE, text=True, cwd="/")
        assert self.proc.stdout.readline().strip() == "ready"
        assert os.stat(self.run_dir).st_uid == ATTACKER

    def end(self) -> None:
        self.proc.kill()
        self.proc.wait(30)



def test_her_stop_of_his_run_directory_is_refused_naming_him_and_her_processes_live(shared, victim):
    assert _no_name(ATTACKER)
    her = victim("hers")
    targets = [(her.sleep.pid, her.sleep_ticks), (her.supervisor.pid, her.sup_ticks)]
    for (pid, ticks) in targets:
        for with_lock in (False, True):
            attacker = Attacker(shared, pid, ticks, with_lock)
            try:
                done = stop_as(None, attacker.run_dir, her.env)
            finally:
                attacker.end()
            assert done.returncode == protocol.STOP_FAILED, done
            said = (f"a run directory of uid {ATTACKER}, not yours, user nobody (uid {second_user()[0]}): "
                    "nothing signalled")
            assert said in done.stdout, done
            her.assert_alive()
    done = stop_as(None, her.run_dir, her.env)  # her own run: stopped as ever
    assert done.returncode == protocol.STOP_DONE and "SIGUSR2 sent to supervisor" in done.stdout, done
    assert her.supervisor.wait(60) == 0
    assert read_state(her.run_dir)["outcome"]["exit"] == 0
    assert process_alive(her.sleep.pid, her.sleep_ticks)


def test_roots_stop_of_his_run_directory_signals_no_process_he_names_and_root_still_stops_hers(shared, victim):
    her = victim("hers")
    mine = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        mine_ticks = process_start_ticks(mine.pid)
        for (pid, ticks) in [(mine.pid, mine_ticks), (her.supervisor.pid, her.sup_ticks)]:
            for with_lock in (False, True):
                attacker = Attacker(shared, pid, ticks, with_lock)
                try:
                    done = stop_as([sys.executable, "-m", "minilmd.cli"], attacker.run_dir, her.env)
                finally:
                    attacker.end()
                assert " sent to supervisor" not in done.stdout, done
                if with_lock:  # the lock's holder is his script: the pid its body names holds nothing
                    assert done.returncode == protocol.STOP_FAILED and "not proven" in done.stdout, done
                assert process_alive(mine.pid, mine_ticks), "root's sleep was signalled"
                her.assert_alive()
        done = stop_as([sys.executable, "-m", "minilmd.cli"], her.run_dir, her.env)  # root stops her run
        assert done.returncode == protocol.STOP_DONE and "SIGUSR2 sent to supervisor" in done.stdout, done
        assert her.supervisor.wait(60) == 0
        assert process_alive(mine.pid, mine_ticks) and process_alive(her.sleep.pid, her.sleep_ticks)
    finally:
        mine.kill()
        mine.wait()


def _no_name(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return True
    return False


def test_a_supervisor_holding_the_lock_without_its_identity_is_not_signalled(tmp_path):
    """The lock alone is not enough: a process of ours that holds a run's lock but whose environment does not carry
    the run directory and the id of the lock's body (a supervisor of an older minilmd; anything else) is left."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / names.STATE).write_text(json.dumps(new_state("r", run_dir, "r.toml")))
    holder = subprocess.Popen([sys.executable, "-c", ATTACK, str(run_dir), "{}",
                               json.dumps({"pid": 0, "host": socket.gethostname(), "launch_id": "x"})],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        body = json.dumps({"pid": holder.pid, "host": socket.gethostname(), "since": 1.0, "launch_id": "x"})
        (run_dir / names.LOCK).write_text(body)  # the body now names the holder itself
        done = subprocess.run([sys.executable, "-m", "minilmd.cli", "stop", "--timeout", "5", str(run_dir)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == protocol.STOP_FAILED, done
        assert "does not carry this run's directory and the supervisor id" in done.stdout, done
        assert holder.poll() is None
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
