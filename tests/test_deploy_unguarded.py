"""A run whose tmux session was closed under it (`tmux kill-session`: window run's restart loop dies of the hangup,
the supervisor reopens its log and trains on) is unguarded: nothing starts it again if it dies (user3 F2). Before,
nothing said so, and the launcher run again refused with "run already owned by another supervisor ... nothing was
started", exit 2, giving no window back. Now `minilmd status` says "unguarded" (daemon/base/keeper.py: the recorded
parent of the supervisor is gone), and the launcher opens window logs alone on it, saying it does not guard it; a
run whose supervisor runs guarded elsewhere is refused, saying it goes on and how to have the launcher run it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from deploy_helpers import MINILMD, launcher, launcher_config  # noqa: F401
from minilmd.daemon.base.keeper import unguarded
from minilmd.daemon.base.statesections import StateJson, SupervisorInfo
from minilmd.daemon.host.lock import lock_holder
from minilmd.proc_info import process_start_ticks
from supervisor_helpers import cli, env_for, state, step_of_state, write_config
from waiting import wait_until


def record_with_parent(parent_pid: int, parent_ticks: int | None, unit: str = "") -> StateJson:
    """A state.json of this process as the supervisor, started by `parent_pid`."""
    me = os.getpid()
    return StateJson(supervisor=SupervisorInfo(pid=me, start_ticks=process_start_ticks(me), parent_pid=parent_pid,
                                               parent_start_ticks=parent_ticks, systemd_unit=unit))


def test_a_supervisor_is_unguarded_once_the_process_that_started_it_has_ended():
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    ticks = process_start_ticks(parent.pid)
    try:
        assert unguarded(record_with_parent(parent.pid, ticks), alive=True) is None  # its starter still runs
    finally:
        parent.kill()
        parent.wait()
    words = unguarded(record_with_parent(parent.pid, ticks), alive=True)
    assert words and words.startswith("unguarded: ") and "nothing starts it again if it dies" in words, words
    assert unguarded(record_with_parent(parent.pid, ticks), alive=False) is None  # not running: nothing to guard
    assert unguarded(record_with_parent(parent.pid, ticks, unit="minilmd@x.service"), alive=True) is None  # systemd's
    assert unguarded(record_with_parent(0, None), alive=True) is None  # an older record: no parent known


def test_a_run_running_guarded_elsewhere_is_refused_saying_it_goes_on(launcher):
    config = launcher_config(launcher.root / "g.toml", "g", str(launcher.root / "runs" / "g"))
    said = json.dumps({"running": True, "state": {"supervisor": {"pid": os.getpid()}}})
    out = launcher("--no-attach", str(config), MINILMD_STAND_IN_CHECK_EXIT="2", MINILMD_STAND_IN_STATUS=said)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"its run already runs (supervisor pid {os.getpid()}" in out.stderr and "and goes on" in out.stderr \
        and "wait for the stop, then launch again" in out.stderr, out.stderr
    assert launcher.tmux("list-sessions").returncode != 0  # nothing started


@pytest.mark.slow
def test_a_closed_session_leaves_the_run_unguarded_and_the_launcher_follows_it(tmp_path, corpus, launcher):
    config = write_config(tmp_path, corpus, name="alone", train={"max_steps": 100000, "checkpoint_every": 5})
    run_dir = tmp_path / "alone" / "run"
    env = {k: v for k, v in env_for(FAKE_STEP_S="0.05").items() if k not in launcher.env and k != "TMUX"}
    out = launcher("--no-attach", str(config), MINILMD=str(MINILMD), **env)
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        wait_until(lambda: step_of_state(run_dir) >= 3, 120, "the supervisor's trainer to train")
        supervisor = lock_holder(run_dir)
        assert cli("status", str(run_dir)).stdout.count("unguarded") == 0  # window run's loop guards it
        assert launcher.tmux("kill-session", "-t", "=minilmd-alone").returncode == 0
        wait_until(lambda: "unguarded: " in cli("status", str(run_dir)).stdout, 120, "status to say unguarded")
        assert lock_holder(run_dir).pid == supervisor.pid and state(run_dir)["phase"] == "training"

        again = launcher("--no-attach", str(config), MINILMD=str(MINILMD), **env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"supervisor pid {supervisor.pid} already runs, unguarded" in again.stdout, again.stdout
        assert [name for _, name, _, _ in launcher.windows("minilmd-alone")] == ["logs"]
        assert lock_holder(run_dir).pid == supervisor.pid  # no second supervisor, none stopped
        stop = cli("stop", str(run_dir), timeout=200)
        assert stop.returncode == 0, stop.stdout + stop.stderr
    finally:
        holder = lock_holder(run_dir)
        if holder is not None:  # a failure above: nothing else ends an unguarded supervisor
            os.kill(holder.pid, signal.SIGKILL)
