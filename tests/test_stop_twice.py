"""`minilmd stop` run again, or from two terminals at once, while the trainer saves: never the second stop signal
that kills the trainer in its save; a SIGTERM after it still is.

Found by a new user: a `minilmd stop --timeout 3` gave up waiting on a slow save (exit 1, "the stop goes on"), and
the `minilmd stop` she ran next to keep waiting sent a second SIGTERM: `second stop signal: killed the trainer ...
its save, if it had not finished, is lost`, while that stop printed "stopped ... exit 0". Two stops at one moment
did the same. `stop` now sends SIGUSR2 (daemon/views/stop.py stop_signal), which the supervisor takes as a stop
however often it comes (daemon/host/signals.py); SIGTERM and SIGINT keep their meaning, a second one kills. Real
supervisor, fake trainer held in its stop's save (FAKE_STOP_HOLD), real `minilmd stop`s and signals.
"""
from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.views.stop import stop_signal
from supervisor_helpers import start_supervisor, wait_for, wait_or_kill, write_config


@contextlib.contextmanager
def _held_in_a_stops_save(tmp_path, corpus) -> Iterator[tuple[subprocess.Popen, Path, Path, Path]]:
    """(supervisor, its output file, run dir, release path): the trainer held at step 7, its stop's save to be held
    before it lands until `release` exists; the hold ended and the supervisor killed, if need be, afterwards."""
    config = write_config(tmp_path, corpus, train={"max_steps": 100000, "checkpoint_every": 5},
                          restart={"hang_timeout": "300s"})  # no SIGKILL for a slow save
    run_dir = load_config(config).run_dir
    release, out = tmp_path / "release", tmp_path / "sup.out"
    sup = start_supervisor(config, out, FAKE_HOLD=f"7:{tmp_path / 'never'}", FAKE_HOLD_STOPS="1",
                           FAKE_STOP_HOLD=f"before:{release}")
    try:
        wait_for(lambda: _heartbeat_step(run_dir) == "7" or sup.poll() is not None, 120, "the hold at step 7")
        assert sup.poll() is None, out.read_text()
        yield sup, out, run_dir, release
    finally:
        release.touch()
        if sup.poll() is None:
            sup.kill()


def _heartbeat_step(run_dir) -> str:
    try:
        return (run_dir / names.HEARTBEAT).read_text().split(maxsplit=1)[0].split("/")[0]  # "STEP/TOTAL"
    except (OSError, IndexError):
        return ""


def _stop(run_dir, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "minilmd.cli", "stop", str(run_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_a_stop_run_again_and_two_at_once_while_the_trainer_saves_never_kill_it(tmp_path, corpus):
    with _held_in_a_stops_save(tmp_path, corpus) as (sup, out, run_dir, release):
        first = _stop(run_dir, "--timeout", "2")
        said_first = first.communicate(timeout=120)[0]
        assert first.returncode == 1 and "still running after 2s" in said_first, said_first
        assert f"SIGUSR2 sent to supervisor pid {sup.pid}" in said_first, said_first
        wait_for(lambda: (tmp_path / "release.holding").exists(), 120, "the trainer holding its stop's save")
        again = [_stop(run_dir), _stop(run_dir)]  # run again to keep waiting, from two terminals at once
        for stop in again:
            assert "SIGUSR2 sent to supervisor pid" in stop.stdout.readline()  # said once sent, before it waits
        assert all(stop.poll() is None for stop in again)  # each waits for the save
        release.touch()
        for stop in again:
            said = stop.communicate(timeout=120)[0]
            assert stop.returncode == 0 and "stopped after" in said, said
        assert wait_or_kill(sup, 120) == 0
    said = out.read_text()
    assert "stop requested (`minilmd stop`'s SIGUSR2)" in said, said
    assert "second stop signal" not in said and "killed by the supervisor" not in said, said


@pytest.mark.slow
def test_a_sigterm_after_minilmd_stop_is_still_the_second_stop_signal_and_stop_says_so(tmp_path, corpus):
    """`minilmd stop`, then `kill -TERM` (or Ctrl-C, or systemctl stop) while the trainer saves: that one is meant to
    cut the save short, as before; the stop still waiting says it in its report (a new user's saw only `stopped on
    request`), as the run's last error."""
    with _held_in_a_stops_save(tmp_path, corpus) as (sup, out, run_dir, release):
        stopping = _stop(run_dir)
        assert "SIGUSR2 sent to supervisor pid" in stopping.stdout.readline()
        wait_for(lambda: (tmp_path / "release.holding").exists(), 120, "the trainer holding its stop's save")
        sup.send_signal(signal.SIGTERM)
        said_stop = stopping.communicate(timeout=120)[0]
        wait_or_kill(sup, 120)  # its exit status is the restart's business; what it said is asserted
    said = out.read_text()
    assert "second stop signal: killed the trainer" in said, said
    assert "killed by the supervisor on a second stop signal (SIGKILL)" in said, said
    assert "  last error" in said_stop and "second stop signal: killed the trainer" in said_stop, said_stop


def test_stop_sends_sigusr2_only_to_a_process_that_catches_it():
    """A supervisor of an older minilmd has no SIGUSR2 handler: its default action would kill it, so it gets the
    SIGTERM it always got."""
    catches = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                "signal.signal(signal.SIGUSR2, lambda *a: None)\nprint('ready', flush=True)\n"
                                "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    plain = subprocess.Popen(["sleep", "60"])
    try:
        assert catches.stdout.readline() == "ready\n"
        assert stop_signal(catches.pid) == signal.SIGUSR2
        assert stop_signal(plain.pid) == signal.SIGTERM
    finally:
        catches.kill()
        plain.kill()
        catches.wait()
        plain.wait()


def test_an_older_supervisor_already_stopping_gets_no_second_sigterm():
    """A supervisor of an older minilmd (no SIGUSR2 handler) still gets SIGTERM, but not while its state.json says
    it is stopping: that SIGTERM would be its second (a supervisor started before an upgrade runs for days)."""
    from minilmd.daemon.base.statesections import StateJson, SupervisorInfo
    from minilmd.daemon.views.stop import _stopping_already

    def state(phase: str) -> StateJson:
        return StateJson(phase=phase, supervisor=SupervisorInfo(pid=4242, start_ticks=900))

    assert _stopping_already(state("stopping"), 4242, 900)
    assert not _stopping_already(state("training"), 4242, 900)
    assert not _stopping_already(state("stopping"), 4242, 901)  # another process of that pid
    assert not _stopping_already(state("stopping"), 4242, None)
