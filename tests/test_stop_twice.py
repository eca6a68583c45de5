"""`minilmd stop` run again, or from two terminals at once, while the trainer saves: one SIGTERM reaches the
supervisor, never a second one, which kills the trainer in its save.

Found by a new user: a `minilmd stop --timeout 3` gave up waiting on a slow save (exit 1, "the stop goes on"), and
the `minilmd stop` she ran next to keep waiting sent a second SIGTERM: `second stop signal: killed the trainer ...
its save, if it had not finished, is lost`, while that stop printed "stopped ... exit 0". Two stops at one moment
did the same. Now the supervisor records in state.json when it took its stop (SupervisorInfo.stop_taken), a stop
that finds it recorded waits without a signal, and stops take turns (an flock on the run directory) between looking
and signalling. Real supervisor, fake trainer held in its stop's save (FAKE_STOP_HOLD), real `minilmd stop`s.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys

import pytest

from minilmd import names
from minilmd.config import load_config
from supervisor_helpers import start_supervisor, wait_for, wait_or_kill, write_config


def _held_in_a_stops_save(tmp_path, corpus):
    """(supervisor, its output file, run dir, release path): the trainer held at step 7, its stop's save to be held
    before it lands until `release` exists."""
    config = write_config(tmp_path, corpus, train={"max_steps": 100000, "checkpoint_every": 5},
                          restart={"hang_timeout": "300s"})  # no SIGKILL for a slow save
    run_dir = load_config(config).run_dir
    release, out = tmp_path / "release", tmp_path / "sup.out"
    sup = start_supervisor(config, out, FAKE_HOLD=f"7:{tmp_path / 'never'}", FAKE_HOLD_STOPS="1",
                           FAKE_STOP_HOLD=f"before:{release}")
    wait_for(lambda: _heartbeat_step(run_dir) == "7" or sup.poll() is not None, 120, "the hold at step 7")
    assert sup.poll() is None, out.read_text()
    return sup, out, run_dir, release


def _heartbeat_step(run_dir) -> str:
    try:
        return (run_dir / names.HEARTBEAT).read_text().split(maxsplit=1)[0]
    except (OSError, IndexError):
        return ""


def _stop(run_dir, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "minilmd.cli", "stop", str(run_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _stop_taken(run_dir) -> float | None:
    try:
        return json.loads((run_dir / names.STATE).read_text())["supervisor"].get("stop_taken")
    except (OSError, ValueError, KeyError):
        return None


@pytest.mark.slow
def test_a_stop_run_again_while_the_trainer_saves_waits_for_it_and_sends_no_second_sigterm(tmp_path, corpus):
    sup, out, run_dir, release = _held_in_a_stops_save(tmp_path, corpus)
    try:
        first = _stop(run_dir, "--timeout", "2")
        said_first = first.communicate(timeout=120)[0]
        assert first.returncode == 1 and "still running after 2s" in said_first, said_first
        wait_for(lambda: (tmp_path / "release.holding").exists(), 120, "the trainer holding its stop's save")
        again = _stop(run_dir)
        first_line = again.stdout.readline()  # said once it looked (flushed), before it waits
        assert "has been stopping since" in first_line and "not signalled again" in first_line, first_line
        assert again.poll() is None  # it waits for the save
        release.touch()
        said_again = again.communicate(timeout=120)[0]
        assert again.returncode == 0, said_again
        assert wait_or_kill(sup, 120) == 0
    finally:
        release.touch()
        if sup.poll() is None:
            sup.kill()
    said = out.read_text()
    assert "second stop signal" not in said and "stop requested" in said, said
    assert "killed by the supervisor" not in said, said


@pytest.mark.slow
def test_a_stop_that_finds_another_one_signalling_waits_its_turn_and_then_sends_nothing(tmp_path, corpus):
    """The test holds the run directory's flock as a stop does between its look and its SIGTERM: a second stop
    started then signals nothing while it is held; the test sends that SIGTERM itself and lets go once the
    supervisor recorded it; the second stop then finds it taken and waits (before: both signalled)."""
    sup, out, run_dir, release = _held_in_a_stops_save(tmp_path, corpus)
    held = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        second = _stop(run_dir)
        wait_for(lambda: second.poll() is not None or _waits_its_turn(second.pid, run_dir), 60,
                 "the second stop waiting for its turn")
        assert _stop_taken(run_dir) is None and second.poll() is None  # it sent nothing while the turn is taken
        sup.send_signal(signal.SIGTERM)  # the first stop's
        wait_for(lambda: _stop_taken(run_dir) is not None, 60, "the supervisor recording its stop")
        os.close(held)
        held = -1
        wait_for(lambda: (tmp_path / "release.holding").exists(), 120, "the trainer holding its stop's save")
        release.touch()
        said_second = second.communicate(timeout=120)[0]
        assert second.returncode == 0 and "has been stopping since" in said_second, said_second
        assert wait_or_kill(sup, 120) == 0
    finally:
        if held >= 0:
            os.close(held)
        release.touch()
        if sup.poll() is None:
            sup.kill()
    assert "second stop signal" not in out.read_text(), out.read_text()


def _waits_its_turn(pid: int, run_dir) -> bool:
    """Whether the stop process holds the run directory open for reading (not O_PATH, as it judged it): the
    descriptor it takes its turn's flock on, opened just before it tries."""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(run_dir.resolve()):
                flags = int(open(f"/proc/{pid}/fdinfo/{fd}").read().split("flags:")[1].split()[0], 8)
                if not flags & os.O_PATH:
                    return True
    except (OSError, IndexError, ValueError):
        return False
    return False
