"""`minilmd stop` and the orphan hunt signal only processes this run started, and never another user's.

A process that merely carries MINILMD_RUN_DIR=<run dir> in its environment (`setsid env MINILMD_RUN_DIR=... sleep
300`, of root or of nobody) is not the run's trainer: it survives `minilmd stop` on a finished run and the orphan
hunt. A record of the trainer naming another user's process (forged, or a recycled pid) signals nothing, nor does
a supervisor pid that belongs to another user. The run's own orphaned trainer, and the workers it started in
sessions of their own (as torchrun does), are still stopped.
"""
from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import new_state, process_alive, process_environ, process_start_ticks
from minilmd.daemon.child import orphans
from minilmd.daemon.child import process as childmod
from minilmd.daemon.views import stop as views_stop
from minilmd.fsio import atomic_write_json
from second_user import as_user, second_user
from supervisor_helpers import cli
from waiting import wait_until

pytestmark = pytest.mark.root


def finished_run(tmp_path: Path) -> Path:
    """A run directory as a run that ended leaves it: its trainer launched and gone, its supervisor gone."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ended = childmod.launch([sys.executable, "-c", "pass"], run_dir, 1, devices="")
    assert ended.popen.wait(30) == 0
    st = new_state("finished", run_dir, str(tmp_path / "run.toml"))
    st.update(phase="done",
              supervisor={"pid": ended.pid, "start_ticks": ended.start_ticks, "host": socket.gethostname()},
              outcome={"exit": 0, "phase": "done", "time": time.time(), "reason": "the run finished"})
    atomic_write_json(run_dir / names.STATE, st)
    return run_dir


class Decoy:
    """`env MINILMD_RUN_DIR=<run dir> [more] sleep 300` in a session of its own, as root or as the second user."""

    def __init__(self, run_dir: Path, other_user: bool, **more_env: str):
        env = [f"{names.RUN_DIR_ENV}={run_dir.resolve()}", *(f"{k}={v}" for k, v in more_env.items())]
        argv = ["env", *env, "sleep", "300"]
        self.proc = subprocess.Popen(as_user(argv) if other_user else argv, start_new_session=True, cwd="/")
        wait_until(lambda: process_environ(self.pid).get(names.RUN_DIR_ENV) == str(run_dir.resolve()), 60,
                   "the decoy's exec")
        self.ticks = process_start_ticks(self.pid)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None and process_alive(self.pid, self.ticks)

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def decoys(tmp_path):
    second_user()
    made: list[Decoy] = []

    def make(run_dir: Path, other_user: bool, **more_env: str) -> Decoy:
        made.append(Decoy(run_dir, other_user, **more_env))
        return made[-1]

    yield make
    for d in made:
        d.end()


@pytest.mark.slow
def test_stop_on_a_finished_run_spares_processes_that_only_carry_its_run_dir(tmp_path, decoys):
    run_dir = finished_run(tmp_path)
    mine, theirs = decoys(run_dir, other_user=False), decoys(run_dir, other_user=True)
    out = cli("stop", str(run_dir), timeout=60)
    assert out.returncode == 0 and "not running" in out.stdout, out.stdout + out.stderr
    assert mine.alive() and theirs.alive()
    assert orphans.find_orphans(run_dir) == []  # the orphan hunt a supervisor makes at start
    assert orphans.terminate_orphans(run_dir, grace=5) == []
    assert mine.alive() and theirs.alive()


def test_a_trainer_record_naming_another_users_process_signals_nothing(tmp_path, decoys):
    run_dir = finished_run(tmp_path)
    record = json.loads((run_dir / names.TRAINER_RECORD).read_text())
    theirs = decoys(run_dir, other_user=True, **{names.LAUNCH_ID_ENV: record["launch_id"]})
    # forged (or a pid recycled for another user): pid, start time, our uid and host, the launch id in its env
    record.update(pid=theirs.pid, start_ticks=theirs.ticks)
    atomic_write_json(run_dir / names.TRAINER_RECORD, record)
    assert orphans.find_orphans(run_dir) == []
    assert views_stop.stop(run_dir, out=io.StringIO()) == 0
    assert theirs.alive()


def test_stop_never_signals_a_supervisor_of_another_user(tmp_path, decoys):
    run_dir = finished_run(tmp_path)
    theirs = decoys(run_dir, other_user=True)
    st = json.loads((run_dir / names.STATE).read_text())
    st.update(phase="training", outcome=None,
              supervisor={"pid": theirs.pid, "start_ticks": theirs.ticks, "host": socket.gethostname()})
    atomic_write_json(run_dir / names.STATE, st)
    out = io.StringIO()
    # state.json's pid is never signalled: only the holder of the run lock, proven (tests/test_stop_proof.py)
    assert views_stop.stop(run_dir, timeout=5, out=out) == 0
    assert "not running" in out.getvalue() and "SIGTERM" not in out.getvalue(), out.getvalue()
    assert theirs.alive()


def test_stop_of_a_run_that_ended_unfinished_says_what_may_start_it_again(tmp_path):
    """A supervisor SIGKILLed (no outcome recorded) waits for the tmux launcher's or systemd's restart: `stop` finds
    nothing to signal, leaves the stop request that restart honours (tests/test_stop_request.py) and says so (how to
    stop systemd's only for a run that ran under systemd: tests/test_stop_request.py); a finished run's stop says
    nothing of it."""
    run_dir = finished_run(tmp_path)
    out = io.StringIO()
    assert views_stop.stop(run_dir, out=out) == 0
    assert "pending restart" not in out.getvalue() and "systemctl" not in out.getvalue(), out.getvalue()
    st = json.loads((run_dir / names.STATE).read_text())
    st.update(phase="training", outcome=None)
    atomic_write_json(run_dir / names.STATE, st)
    out = io.StringIO()
    assert views_stop.stop(run_dir, out=out) == 0
    said = out.getvalue()
    assert "not running" in said and "the launcher's pending restart will not start the run" in said, said
    assert f"stop request left at {run_dir.resolve() / names.STOP_REQUEST}" in said, said
    assert "systemctl" not in said, said  # its state.json names no systemd unit: no hint that does not apply


WITH_WORKER = textwrap.dedent("""
    import subprocess, sys, time
    # a worker in a session of its own, as torchrun starts its ranks: the trainer's group does not hold it
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    print(worker.pid, flush=True)
    time.sleep(300)
""")


def test_the_orphaned_trainer_of_the_run_and_its_workers_are_stopped_and_nothing_else(tmp_path, decoys):
    run_dir = finished_run(tmp_path)
    mine, theirs = decoys(run_dir, other_user=False), decoys(run_dir, other_user=True)
    trainer = childmod.launch([sys.executable, "-c", WITH_WORKER], run_dir, 2, devices="")
    log = trainer.log_path
    # whole lines only: a pid read while its line is being written would be a prefix of it
    worker = int(wait_until(lambda: [ln for ln in log.read_text().split("\n")[:-1] if ln.isdigit()], 120,
                            "the worker's pid")[0])
    try:
        wait_until(lambda: process_environ(worker).get(names.RUN_DIR_ENV), 60, "the worker's exec")
        assert orphans.find_orphans(run_dir) == sorted([trainer.pid, worker])
        out = io.StringIO()
        assert views_stop.stop(run_dir, out=out) == 0, out.getvalue()
        assert trainer.popen.wait(60) == -signal.SIGTERM
        wait_until(lambda: not process_alive(worker), 60, "the worker's end")
        assert mine.alive() and theirs.alive()
    finally:
        trainer.kill_group()
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass
