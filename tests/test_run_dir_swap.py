"""`stop`, `status` and `forget` act on the run directory judged (daemon/views/runarg.py open_run), never on one
swapped in at its path after the judgement.

The limit closed: runarg judged the run directory by path (its links, its owner, its run files), and the views then
read state.json, the run lock and the stop request by path again. Whoever can rename a directory above the run
directory (its owner's own directory, a team directory above a reader's view) could move it aside in between and put
another run directory there: `stop` then read the other one's lock, proved its supervisor by the path its
environment names and signalled it, and wrote its stop request there; `status` showed the other run's state under the
name judged; `forget` judged by the other one's lock whether the run named still runs. Now the views are handed one
descriptor of the directory judged (O_PATH, O_DIRECTORY, O_NOFOLLOW), every read goes through it, and a write or a
signal (proven by path) is refused once the path leads elsewhere.

The swap is real and happens at the seam: right after runarg's judgement (its run_problem) returns, the judged
directory is renamed aside and the substitute, whose lock a live process holds with the substitute's identity in its
environment, is renamed into its place.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import names, protocol
from minilmd.daemon.base.runstate import new_state, process_start_ticks
from minilmd.daemon.host import registry
from minilmd.daemon.views import overview, runarg
from minilmd.daemon.views import status as views_status
from minilmd.daemon.views import stop as views_stop
from minilmd.fsio import atomic_write_json

HOLDER = """
import fcntl, json, os, signal, sys, time
lock, marker, launch_id = sys.argv[1:4]
fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": os.getpid(), "host": "", "launch_id": launch_id}).encode())
def signalled(*_):
    open(marker, "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, signalled)
print("ready", flush=True)
while True: time.sleep(1)
"""
"""A supervisor as `stop` proves one: it holds the run lock (its body naming it and its launch id) and its
environment carries the run directory and that id; SIGTERM leaves a marker."""


def write_run(run_dir: Path, name: str, at: Path, **fields) -> None:
    run_dir.mkdir(parents=True)
    state = new_state(name, at, str(at / "run.toml"))
    state.update(phase="training", reason="", supervisor={"pid": None}, **fields)
    atomic_write_json(run_dir / names.STATE, state)


def hold_lock(run_dir: Path, at: Path, marker: Path, launch_id: str) -> subprocess.Popen:
    """A live process that holds run_dir's lock with the identity of the run at `at` (the path it will stand at)."""
    env = {**os.environ, names.SUPERVISOR_RUN_DIR_ENV: str(at), names.SUPERVISOR_ID_ENV: launch_id}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir / names.LOCK), str(marker), launch_id],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def swap(judged: Path, substitute: Path) -> None:
    """`judged` renamed aside (to `<judged>.aside`) and `substitute` put at its path, for real."""
    judged.rename(judged.with_name(judged.name + ".aside"))
    substitute.rename(judged)


@pytest.fixture
def swap_after_judgement(monkeypatch):
    """swap_after_judgement(judged, substitute): the swap, once runarg has judged `judged` (its run_problem)."""
    real = runarg.run_problem
    pending: list[tuple[Path, Path]] = []

    def judged_then_swapped(*args, **kwargs):
        problem = real(*args, **kwargs)
        if problem is None and pending:
            swap(*pending.pop())
        return problem

    monkeypatch.setattr(runarg, "run_problem", judged_then_swapped)
    return lambda judged, substitute: pending.append((judged, substitute))


def test_stop_neither_signals_nor_writes_into_a_run_directory_swapped_in_after_the_judgement(
        tmp_path, swap_after_judgement):
    tmp_path = tmp_path.resolve()
    judged, substitute, marker = tmp_path / "run", tmp_path / "other", tmp_path / "signalled"
    write_run(judged, "judged", judged)  # no supervisor: a stop would leave a request and signal nothing
    write_run(substitute, "substitute", judged)
    holder = hold_lock(substitute, judged, marker, "substitute-sup")
    try:
        holder_ticks = process_start_ticks(holder.pid)
        swap_after_judgement(judged, substitute)
        out = io.StringIO()
        code = views_stop.stop(judged, timeout=30, out=out)
        said = out.getvalue()
        assert (judged.with_name("run.aside") / names.STATE).exists()  # the swap did happen
        assert not marker.exists() and holder.poll() is None, said  # the substitute's supervisor: never signalled
        assert process_start_ticks(holder.pid) == holder_ticks
        assert not (judged / names.STOP_REQUEST).exists(), said  # nothing written into the substitute
        assert code == protocol.STOP_FAILED, said
        assert "no longer the run directory named a moment ago" in said and "nothing signalled" in said, said
    finally:
        holder.kill()
        holder.wait()


def test_status_shows_the_run_directory_judged_never_one_swapped_in_after(tmp_path, swap_after_judgement):
    tmp_path = tmp_path.resolve()
    judged, substitute = tmp_path / "run", tmp_path / "other"
    write_run(judged, "judged", judged, outcome={"time": 1, "exit": 0, "reason": "the run finished",
                                                  "ended": "finished"})
    write_run(substitute, "substitute", judged)
    swap_after_judgement(judged, substitute)
    out = io.StringIO()
    assert views_status.status(judged, out=out) == 0
    said = out.getvalue()
    assert "substitute" in (judged / names.STATE).read_text()  # the swap did happen
    assert "run judged" in said and "substitute" not in said, said

    judged.rename(substitute)  # each back at its own path
    judged.with_name("run.aside").rename(judged)
    swap_after_judgement(judged, substitute)
    out = io.StringIO()
    assert views_status.status(judged, as_json=True, out=out) == 0
    assert "substitute" in (judged / names.STATE).read_text()  # swapped again
    assert json.loads(out.getvalue())["state"]["run"] == "judged", out.getvalue()


def test_forget_keeps_a_running_run_whose_directory_a_stopped_one_replaced_after_it_was_looked_at(
        tmp_path, monkeypatch):
    """forget of a run directory whose supervisor runs keeps its entry (a running run stays listed): judged by the
    lock of the directory it looked at, not by a stopped run's put at its path before the lock is read."""
    from minilmd.daemon.views import liveness

    tmp_path = tmp_path.resolve()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "system"))
    judged, substitute, marker = tmp_path / "run", tmp_path / "other", tmp_path / "signalled"
    write_run(judged, "judged", judged)
    write_run(substitute, "substitute", judged)
    registry.register("judged", judged, judged / "run.toml")
    real = liveness.lock_supervisor_or_none

    def swapped_first(*args, **kwargs):
        swap(judged, substitute)
        return real(*args, **kwargs)

    monkeypatch.setattr(liveness, "lock_supervisor_or_none", swapped_first)
    holder = hold_lock(judged, judged, marker, "judged-sup")
    try:
        out = io.StringIO()
        code = overview.forget(str(judged), out=out)
        said = out.getvalue()
        assert "substitute" in (judged / names.STATE).read_text()  # the swap did happen
        assert code == 1 and f"its supervisor (pid {holder.pid}) holds the run's lock" in said, said
        assert [e.run_dir for e in registry.entries()] == [judged], said  # its entry kept
    finally:
        holder.kill()
        holder.wait()


def test_logs_shows_the_logs_of_the_run_directory_judged_under_its_name(tmp_path, swap_after_judgement):
    from minilmd.daemon.views import logs as views_logs

    tmp_path = tmp_path.resolve()
    judged, substitute = tmp_path / "run", tmp_path / "other"
    for run_dir, name in ((judged, "judged"), (substitute, "substitute")):
        write_run(run_dir, name, judged)
        (run_dir / names.SUPERVISOR_LOG).write_text(f"the {name} supervisor's line\n")
        (run_dir / names.ATTEMPT_LOGS).mkdir()
        (run_dir / names.ATTEMPT_LOGS / "attempt-0001.log").write_text(f"the {name} trainer's line\n")
    swap_after_judgement(judged, substitute)
    out = io.StringIO()
    assert views_logs.logs(judged, out=out) == 0
    said = out.getvalue()
    assert "substitute" in (judged / names.STATE).read_text()  # the swap did happen
    assert "the judged supervisor's line" in said and "the judged trainer's line" in said, said
    assert "substitute" not in said and "/proc/" not in said, said
    assert f"==> {judged / names.SUPERVISOR_LOG} <==" in said, said
    assert f"==> {judged / names.ATTEMPT_LOGS / 'attempt-0001.log'} <==" in said, said


def test_plot_draws_the_run_directory_judged(tmp_path, swap_after_judgement):
    pytest.importorskip("matplotlib")
    from typer.testing import CliRunner

    from minilmd.cli import app

    tmp_path = tmp_path.resolve()
    judged, substitute = tmp_path / "run", tmp_path / "other"
    for run_dir, name, steps in ((judged, "judged", 30), (substitute, "substitute", 7)):
        write_run(run_dir, name, judged)
        lines = [{"kind": "train", "step": s, "loss": 5.0 - s / 20, "time": 1000.0 + s} for s in range(1, steps + 1)]
        (run_dir / names.METRICS).write_text("".join(json.dumps(line) + "\n" for line in lines))
    swap_after_judgement(judged, substitute)
    result = CliRunner().invoke(app, ["plot", str(judged), "--out", str(tmp_path / "p.png")])
    assert "substitute" in (judged / names.STATE).read_text()  # the swap did happen
    assert result.exit_code == 0, result.output
    assert "judged" in result.output and "substitute" not in result.output, result.output
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
