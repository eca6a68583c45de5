"""The tmux launcher's window "run" restarts the supervisor as deploy/minilmd@.service does (Restart=on-failure,
RestartPreventExitStatus = protocol.FINAL_EXIT_STATUSES, RestartSec, the start limit), so that a run under tmux
finishes unattended: driven with the stand-in minilmd (tests/deploy_helpers.py), and with the real supervisor
SIGKILLed. Before, a supervisor that ended for any reason left a dead pane until a person ran the launcher again."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from deploy_helpers import LAUNCHER, MINILMD, UNIT, launcher, launcher_config, parse_unit, systemd_seconds  # noqa: F401
from minilmd.daemon.host.lock import lock_holder
from minilmd.protocol import FINAL_EXIT_STATUSES
from supervisor_helpers import env_for, events, state, step_of_state, write_config
from waiting import wait_until

FAST = {"MINILMD_TMUX_RESTART_SEC": "0.1"}


def script_setting(name: str) -> str:
    found = re.search(rf"^{name}=(.*)$", LAUNCHER.read_text(encoding="utf-8"), re.MULTILINE)
    assert found, f"{name} is not set in {LAUNCHER.name}"
    return found[1]


def test_the_launchers_restart_policy_is_the_units():
    service, unit = parse_unit(UNIT.read_text(encoding="utf-8"))["Service"], parse_unit(UNIT.read_text())["Unit"]
    finals = [int(s) for s in script_setting("FINAL_EXIT_STATUSES").strip("()").split()]
    assert sorted(finals) == sorted(FINAL_EXIT_STATUSES) == sorted(int(s) for s in
                                                                   service["RestartPreventExitStatus"][0].split())
    assert int(script_setting("START_LIMIT_BURST")) == int(unit["StartLimitBurst"][0])
    assert int(script_setting("START_LIMIT_INTERVAL")) == systemd_seconds(unit["StartLimitIntervalSec"][0])
    default = re.fullmatch(r"\$\{MINILMD_TMUX_RESTART_SEC:-(\d+)\}", script_setting("restart_sec"))
    assert default and int(default[1]) == systemd_seconds(service["RestartSec"][0])


def start(launcher, name: str, **env: str) -> str:
    config = launcher_config(launcher.root / f"{name}.toml", name, str(launcher.root / "runs" / name))
    out = launcher("--no-attach", str(config), **FAST, **env)
    assert out.returncode == 0, out.stdout + out.stderr
    return f"minilmd-{name}"


@pytest.mark.parametrize("final", FINAL_EXIT_STATUSES)
def test_a_failing_supervisor_is_started_again_until_it_ends_on_a_final_status(launcher, final):
    session = start(launcher, "f", MINILMD_STAND_IN_EXITS=f"1,-9,{final}")
    launcher.wait_dead(session, "run")
    runs = [r for r in launcher.records(4) if r["argv"][0] == "run"]
    assert len(runs) == 3 and len({r["ppid"] for r in runs}) == 1  # one window, its loop started it three times
    shown = launcher.screen(session, "run")
    assert "minilmd run was exit status 1 at " in shown and "starting it again in 0.1s" in shown, shown
    assert "minilmd run was killed by SIGKILL (exit status 137)" in shown, shown
    said = launcher.last_word(session, "run")
    assert said.startswith(f"minilmd-tmux: minilmd run ended with exit status {final}, a final one") and \
        "not restarted" in said, shown


@pytest.mark.parametrize("how", ["0", "-15"], ids=["done", "sigterm"])
def test_a_supervisor_that_ended_cleanly_is_not_started_again(launcher, how):
    """0: done, or stopped on request; death by SIGTERM (as SIGHUP, SIGINT, SIGPIPE) is clean for systemd too."""
    session = start(launcher, "c", MINILMD_STAND_IN_EXITS=how)
    launcher.wait_dead(session, "run")
    assert len([r for r in launcher.records(2) if r["argv"][0] == "run"]) == 1
    said = launcher.last_word(session, "run")
    if how == "0":
        assert "ended with exit status 0 (the run is done, or stopped on request): not restarted" in said, said
    else:
        assert "killed by SIGTERM (exit status 143), a clean end for systemd: not restarted" in said, said


@pytest.mark.parametrize("inherited", [False, True], ids=["clean", "set-where-the-launcher-ran"])
def test_only_the_windows_own_restarts_say_they_are_automatic(launcher, inherited):
    """MINILMD_AUTO_RESTART=tmux (a stop request is honoured: daemon/base/stoprequest.py) on the restarts alone, never
    on the first start, the person's: not even when the launcher (and so the tmux server) ran with it set."""
    session = start(launcher, "a", MINILMD_STAND_IN_EXITS="1,-9,0", **({"MINILMD_AUTO_RESTART": "tmux"} if inherited
                                                                       else {}))
    launcher.wait_dead(session, "run")
    assert [r["auto_restart"] for r in launcher.records(3) if r["argv"][0] == "run"] == [None, "tmux", "tmux"]


def test_the_start_limit_ends_a_supervisor_that_keeps_failing(launcher):
    session = start(launcher, "l", MINILMD_STAND_IN_EXITS="1,1,1,1,1,1,1,1")
    launcher.wait_dead(session, "run")
    assert len([r for r in launcher.records(6) if r["argv"][0] == "run"]) == 5
    said = launcher.last_word(session, "run")
    assert "5 starts within 3600s, the last exit status 1: not started again" in said, said


def test_a_restart_delay_that_is_no_number_is_refused_and_nothing_starts(launcher):
    config = launcher_config(launcher.root / "d.toml", "d", str(launcher.root / "runs" / "d"))
    out = launcher("--no-attach", str(config), MINILMD_TMUX_RESTART_SEC="5m")
    assert out.returncode == 2 and "MINILMD_TMUX_RESTART_SEC=5m is not a number" in out.stderr, out.stderr
    assert launcher.tmux("list-sessions").returncode != 0 and not launcher.record.exists()


@pytest.mark.slow
def test_a_real_supervisor_sigkilled_under_tmux_comes_back_and_a_stop_ends_the_window(tmp_path, corpus, launcher):
    """The real `minilmd run` (fake trainer) under the launcher: SIGKILLed, it is started again by the window
    without anyone calling the launcher; the new supervisor stops the orphaned trainer and resumes; `minilmd stop`
    then ends the window with exit 0."""
    config = write_config(tmp_path, corpus, name="real", train={"max_steps": 100000, "checkpoint_every": 5})
    run_dir = tmp_path / "real" / "run"
    env = {k: v for k, v in env_for(FAKE_STEP_S="0.05").items() if k not in launcher.env and k != "TMUX"}
    out = launcher("--no-attach", str(config), MINILMD=str(MINILMD), MINILMD_TMUX_RESTART_SEC="0.5", **env)
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        wait_until(lambda: step_of_state(run_dir) >= 6, 120, "the first supervisor's trainer to train")
        first = lock_holder(run_dir)
        orphan = state(run_dir)["child"]["pid"]
        os.kill(first.pid, signal.SIGKILL)
        wait_until(lambda: (lock_holder(run_dir) or first).pid != first.pid
                   and (state(run_dir).get("child") or {}).get("pid") not in (None, orphan)
                   and state(run_dir).get("phase") == "training", 120, "the supervisor started again by tmux")
        assert [e["pids"] for e in events(run_dir) if e["event"] == "orphan" and "pids" in e] == [[orphan]]
        shown = launcher.screen("minilmd-real", "run")
        assert "minilmd run was killed by SIGKILL (exit status 137)" in shown, shown
        stop = subprocess.run([sys.executable, "-m", "minilmd.cli", "stop", str(run_dir)], capture_output=True,
                              text=True, timeout=200, env=env_for())
        assert stop.returncode == 0, stop.stdout + stop.stderr
        launcher.wait_dead("minilmd-real", "run")
    finally:
        holder = lock_holder(run_dir)
        if holder is not None:  # a failure above: the supervisor ignores the tmux server's SIGHUP; end it here
            os.kill(holder.pid, signal.SIGKILL)
    said = launcher.last_word("minilmd-real", "run")
    assert "ended with exit status 0 (the run is done, or stopped on request): not restarted" in said, said
    assert state(run_dir)["phase"] == "done"
