"""`minilmd stop` while a start is under way: in the half second after `minilmd run` began, before its supervisor
takes the run lock, a stop finds none (daemon/base/stoprequest.py): its request, told in this boot's clock, is that
start's to honour; a request left at a run's end (after_end) is for such a start only, and goes with the next start
of any kind. The launcher's automatic restarts and the rest of the request's life: tests/test_stop_request.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minilmd import names, protocol
from minilmd.daemon.base import stoprequest
from minilmd.proc_info import boot_id, since_boot, started_since_boot
from supervisor_helpers import (
    env_for,
    events,
    launches_after_last_start,
    run_supervisor,
    start_supervisor,
    state,
    step_of_state,
    stop_cli,
    write_config,
)
from waiting import wait_until


@pytest.mark.slow
@pytest.mark.parametrize("before", ["stopped", "killed"])
def test_a_stop_while_a_start_is_under_way_stops_it(tmp_path, corpus, before):
    """`minilmd stop` in the half second after `minilmd run` began, before its supervisor takes the run lock (a
    script's `minilmd run CFG & minilmd stop DIR`): it found the previous run's record, said `not running (ended
    ..., exit 0: stopped on request)`, and the new run trained on, since a start by hand cleared the request (or no
    request was left, for a run that ended for good). A request asked after a start began is that start's to honour.
    The start is held before its interpreter runs (a shell stopping itself, then exec: the same process, so the same
    start time), so the stop surely comes before the lock."""
    config = write_config(tmp_path, corpus, name="uw", train={"max_steps": 40, "checkpoint_every": 5})
    run_dir = tmp_path / "uw" / "run"
    first = start_supervisor(config, tmp_path / "first.out", FAKE_STEP_S="0.05",
                             FAKE_HOLD=f"6:{tmp_path / 'never'}", FAKE_HOLD_STOPS="1")
    try:
        wait_until(lambda: step_of_state(run_dir) >= 6, 120, "the first supervisor's trainer to train")
        if before == "stopped":  # ended for good, exit 0: an after_end request
            assert stop_cli(run_dir).returncode in (protocol.STOP_DONE, protocol.STOP_UNSYNCED)
        else:  # killed, no outcome: a launcher's restart may follow, an ordinary request
            first.kill()
    finally:
        first.wait(120)
    if before == "killed":
        assert stop_cli(run_dir).returncode in (protocol.STOP_DONE, protocol.STOP_UNSYNCED)  # the orphan stopped
    with open(tmp_path / "second.out", "ab") as second:
        held = subprocess.Popen(["sh", "-c", 'kill -STOP $$ && exec "$0" -m minilmd.cli run "$1"', sys.executable,
                                 str(config)], stdout=second, stderr=subprocess.STDOUT, env=env_for(FAKE_STEP_S="0.05"))
    try:
        wait_until(lambda: _state_letter(held.pid) == "T", 60, "the start held before its interpreter")
        stopped = stop_cli(run_dir)
        assert stopped.returncode in (protocol.STOP_DONE, protocol.STOP_UNSYNCED), stopped.stdout + stopped.stderr
        assert "not running" in stopped.stdout, stopped.stdout
        held.send_signal(signal.SIGCONT)
        assert held.wait(120) == 0, (tmp_path / "second.out").read_text()[-3000:]
    finally:
        if held.poll() is None:
            held.kill()
            held.wait()
    assert launches_after_last_start(run_dir) == [], (tmp_path / "second.out").read_text()[-3000:]
    reason = state(run_dir)["outcome"]["reason"]
    assert reason.startswith("stopped on request (minilmd stop at ") and "asked as this start began" in reason, reason
    said = [e["message"] for e in events(run_dir) if e["event"] == "stop_request"][-1]
    assert "asked after this start began" in said, said

    assert run_supervisor(config, tmp_path, FAKE_STEP_S="0") == 0  # a start after the stop clears it, runs
    assert not (run_dir / names.STOP_REQUEST).exists()
    assert state(run_dir)["outcome"]["reason"].startswith("the run finished"), state(run_dir)["outcome"]


def _state_letter(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def test_a_stop_is_told_asked_after_a_start_in_this_boots_clock_only(tmp_path):
    """asked_after_start's inputs: the process's start in seconds since boot (proc_info.started_since_boot, from its
    start ticks) and the request's boot and time since it. Another boot's request (another host's, or one written
    before a reboot), or one without those, is never after; a wall-clock time has no say."""
    before = since_boot()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) as child:
        after = since_boot()
        try:
            started = started_since_boot(child.pid)
            assert started is not None and before - 0.25 <= started <= after + 0.25, (before, started, after)
        finally:
            child.kill()
    here, path = boot_id(), tmp_path / names.STOP_REQUEST
    mine = started_since_boot(os.getpid())

    def asked(boot: str, at: float | None, wall: float | None = None) -> bool:
        return stoprequest.asked_after_start(stoprequest.StopRequest(path, wall, "", boot, at))

    assert asked(here, since_boot()) and asked(here, mine, wall=0.0)  # the wall clock's time is not read
    assert not asked(here, mine - 1, wall=time.time() + 3600)  # a wall clock stepped back since: still before
    assert not asked(ANOTHER_BOOT, since_boot()) and not asked("", since_boot()) and not asked(here, None)


ANOTHER_BOOT = "00000000-0000-4000-8000-000000000000"
"""A boot id of no boot of this test's (the kernel draws them at random)."""


def test_a_sigusr2_is_minilmd_stops_only_with_a_request_written_in_this_boot_after_this_process_began(tmp_path):
    """stoprequest.asked_now, which in a Slurm job tells `minilmd stop`'s SIGUSR2 from Slurm's B:USR2 warning: stop
    writes its request on this host just before its signal, so only a request of this boot after this process's
    start is its. One left by an earlier stop on another node or before a reboot (still in run.dir during the
    scratch wait, before at_start clears it), or one with no boot time, is none. Before, another boot's request
    counted as current: Slurm's warning was taken as a stop, and the job was never requeued."""
    run_dir = tmp_path
    path = run_dir / names.STOP_REQUEST
    assert not stoprequest.asked_now(run_dir)  # none at all
    stoprequest.leave(run_dir, os.getuid())
    assert stoprequest.asked_now(run_dir)  # what `minilmd stop` writes just before its SIGUSR2
    written = json.loads(path.read_text())

    def rewritten(**changes: object) -> bool:
        path.write_text(json.dumps({**written, **changes}))
        return stoprequest.asked_now(run_dir)

    assert rewritten() and rewritten(time=0)  # the wall clock has no say
    assert not rewritten(boot=ANOTHER_BOOT), "another boot's request (another node, a reboot) taken as current"
    assert not rewritten(boot="") and not rewritten(since_boot=None)
    assert not rewritten(since_boot=started_since_boot(os.getpid()) - 5)  # before this process began
    path.write_text("not json")
    assert not stoprequest.asked_now(run_dir)  # a request with no time: not one stop writes before its signal


def _request_before_this_process(run_dir: Path, after_end: bool = False) -> None:
    """A request as a `stop` before this process began would have left it (its time since boot before our start)."""
    stoprequest.leave(run_dir, os.getuid(), after_end=after_end)
    path = run_dir / names.STOP_REQUEST
    body = json.loads(path.read_text())
    body["since_boot"] = started_since_boot(os.getpid()) - 5
    path.write_text(json.dumps(body))


SLURM_REQUEUED = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}
TMUX_RESTART = {names.AUTO_RESTART_ENV: "tmux"}


def test_what_reads_the_request_again_later_judges_it_as_the_start_did(tmp_path):
    """stoprequest.honoured (a Slurm preemption's plan in the scratch wait, at the end, at the last sync's cut): a
    request from before a start by hand is that start's to clear, not a stop asked; an automatic restart's is; one
    asked after the start began is, whatever the start."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _request_before_this_process(run_dir)
    assert stoprequest.honoured(run_dir, {}) is None
    assert stoprequest.honoured(run_dir, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"}) is None  # sbatch'd
    assert stoprequest.honoured(run_dir, SLURM_REQUEUED) is not None
    stoprequest.leave(run_dir, os.getuid())  # asked now, after this process began
    assert stoprequest.honoured(run_dir, {}) is not None
    stoprequest.clear(run_dir)
    _request_before_this_process(run_dir, after_end=True)  # at a run's end, for a start under way then
    assert stoprequest.honoured(run_dir, SLURM_REQUEUED) is None and stoprequest.honoured(run_dir, {}) is None


@pytest.mark.parametrize("environ", [{}, TMUX_RESTART, SLURM_REQUEUED], ids=["by-hand", "tmux", "requeue"])
def test_a_request_left_at_a_runs_end_stops_no_later_start_and_goes_with_the_first(tmp_path, environ):
    """A request marked after_end (stop found the run ended for good and no supervisor) is for a start then under way.
    Any start that began after it, automatic ones too, removes it once read and runs: before, a tmux restart or a
    Slurm requeue weeks later honoured the request status never showed, and stopped the run 'on request'."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _request_before_this_process(run_dir, after_end=True)
    said: list[str] = []
    assert stoprequest.at_start(run_dir, dict(environ), lambda event, message, **_: said.append(message)) is None
    assert not (run_dir / names.STOP_REQUEST).exists()
    assert len(said) == 1 and "cleared, given after the run had ended, for a start then under way" in said[0], said

    stoprequest.leave(run_dir, os.getuid(), after_end=True)  # asked after this start began: honoured, and gone
    stops = stoprequest.at_start(run_dir, dict(environ), lambda *_, **__: None)
    assert stops is not None and "asked as this start began" in stops[0], stops
    assert not (run_dir / names.STOP_REQUEST).exists()
