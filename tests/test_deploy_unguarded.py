"""A run whose tmux session was closed under it (`tmux kill-session`: window run's restart loop dies of the hangup,
the supervisor reopens its log and trains on) is unguarded: nothing starts it again if it dies (user3 F2). Before,
nothing said so, and the launcher run again refused with "run already owned by another supervisor ... nothing was
started", exit 2, giving no window back. Now `minilmd status` says "unguarded" (daemon/base/keeper.py: the recorded
parent of the supervisor is gone), and the launcher opens window logs alone on it, saying it does not guard it; a
run whose supervisor runs guarded elsewhere is refused, saying it goes on and how to have the launcher run it."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy_helpers import MINILMD, launcher, launcher_config  # noqa: F401
from minilmd.daemon.base.keeper import unguarded
from minilmd.daemon.base.statesections import StateJson, SupervisorInfo
from minilmd.daemon.host.lock import lock_holder
from minilmd.proc_info import process_start_ticks
from supervisor_helpers import cli, env_for, state, step_of_state, write_config
from waiting import wait_until

STARTER = ("import subprocess, sys, time\n"
           "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
           "print(child.pid, flush=True)\n"
           "time.sleep(600)\n")
"""A starter (a tmux window's loop, a Slurm batch step, su) that starts a stand-in supervisor and waits."""


@contextlib.contextmanager
def started() -> Iterator[tuple[subprocess.Popen, int]]:
    """(the starter, the pid of the stand-in supervisor it started): real processes, both killed after."""
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True)
    child = int(starter.stdout.readline())
    try:
        yield starter, child
    finally:
        starter.kill()
        starter.wait()
        os.kill(child, signal.SIGKILL)


def record_of(starter: subprocess.Popen, child: int, unit: str = "", parent: int | None = None) -> StateJson:
    """The state.json the stand-in supervisor `child` of `starter` would write (new_state's supervisor section)."""
    return StateJson(supervisor=SupervisorInfo(
        pid=child, start_ticks=process_start_ticks(child), parent_pid=starter.pid if parent is None else parent,
        parent_start_ticks=process_start_ticks(starter.pid), systemd_unit=unit))


def test_a_supervisor_is_unguarded_once_the_process_that_started_it_has_ended():
    with started() as (starter, child):
        record = record_of(starter, child)
        assert unguarded(record, alive=True) is None  # its starter still runs
        starter.kill()
        starter.wait()
        wait_until(lambda: unguarded(record, alive=True) is not None, 60, "the reparented supervisor said unguarded")
        words = unguarded(record, alive=True)
        assert words and words.startswith("unguarded: ") and "nothing starts it again if it dies" in words, words
        assert unguarded(record, alive=False) is None  # not running: nothing to guard
        assert unguarded(record_of(starter, child, unit="minilmd@x.service"), alive=True) is None  # systemd's
        assert unguarded(record_of(starter, child, parent=0), alive=True) is None  # an older record: no parent known


def test_a_supervisor_whose_starter_is_hidden_from_its_user_is_not_called_unguarded(monkeypatch):
    """/proc mounted hidepid=2 (common on shared servers and Slurm clusters) shows a user only her own processes, and
    a supervisor's starter may be another user's: `exec minilmd run` in an sbatch script is slurmstepd's (root's)
    child, `su`/`sudo -u` start it under root's process. Before, keeper read the starter's /proc entry, found none
    and called every such run unguarded, "has ended ... nothing starts it again"; the tmux launcher took it for its
    own closed session. The starter's end is proven by the supervisor's own entry now: its parent is another one
    (it was reparented). Faked: the starter's /proc entry reads as missing, as hidepid=2 makes it."""
    with started() as (starter, child):
        record = record_of(starter, child)
        hidden, real_read = f"/proc/{starter.pid}/", Path.read_text

        def hidepid(path, *args, **kwargs):
            if str(path).startswith(hidden):
                raise FileNotFoundError(2, "No such file or directory", str(path))
            return real_read(path, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", hidepid)
        assert unguarded(record, alive=True) is None  # its starter runs, unseen
        monkeypatch.undo()
        starter.kill()
        starter.wait()
        wait_until(lambda: unguarded(record, alive=True) is not None, 60, "the reparented supervisor said unguarded")


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
