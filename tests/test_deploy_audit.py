"""How minilmd runs as a service, seen from outside: the real supervisor under the real tmux launcher
(deploy/minilmd-tmux.sh) on a private tmux server, and the launcher itself with a stand-in minilmd."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from deploy_helpers import LAUNCHER, MINILMD, launcher, launcher_config  # noqa: F401 - a fixture
from minilmd.daemon.host.lock import lock_holder
from supervisor_helpers import env_for, events, state, step_of_state, write_config
from waiting import wait_until


@pytest.fixture
def tmux_root():
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    # short: tmux's socket path under TMUX_TMPDIR must stay under 108 bytes
    root = Path(tempfile.mkdtemp(prefix="mtaud-"))
    socket = f"minilmd-audit-{os.getpid()}"
    try:
        yield root, socket
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=30,
                       env={**os.environ, "TMUX_TMPDIR": str(root)})
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_closing_the_tmux_session_does_not_end_the_run(tmp_path, corpus, tmux_root):
    """`tmux kill-session` (or the window closed by hand) hangs up the supervisor's terminal: SIGHUP, then every
    write to it fails with EIO. The supervisor echoes its events there; the run must go on to its end anyway."""
    root, socket = tmux_root
    config = write_config(tmp_path, corpus, name="tm", remote=False)
    run_dir = tmp_path / "tm" / "run"
    release = tmp_path / "release"  # the trainer held at step 2 until the session is gone: the run surely goes on
    env = env_for(FAKE_HOLD=f"2:{release}", MINILMD=str(MINILMD), MINILMD_TMUX_SOCKET=socket,
                  TMUX_TMPDIR=str(root))
    env = {k: v for k, v in env.items() if k != "TMUX"}
    out = subprocess.run(["bash", str(LAUNCHER), "--no-attach", str(config)], capture_output=True, text=True,
                         timeout=120, env=env, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    wait_until(lambda: step_of_state(run_dir) >= 2, 120, "the trainer to take two steps")

    subprocess.run(["tmux", "-L", socket, "kill-session", "-t", "=minilmd-tm"], check=True, timeout=30, env=env)
    release.touch()

    wait_until(lambda: lock_holder(run_dir) is None, 120, "the supervisor to end")
    crashes = [e["message"] for e in events(run_dir) if e["event"] == "crash"]
    assert crashes == [], crashes
    assert state(run_dir)["phase"] == "done"
    assert step_of_state(run_dir) == 30


def test_a_second_run_whose_name_maps_to_the_same_session_is_refused_not_reported_running(launcher):
    """tmux names cannot hold '.' or ':', so runs `exp.1` and `exp_1` both get session minilmd-exp_1: the second
    launch used to find the first run's supervisor alive, say `window run is running` and exit 0, its own run never
    started."""
    first = launcher_config(launcher.root / "a.toml", "exp.1", str(launcher.root / "runs" / "a"))
    second = launcher_config(launcher.root / "b.toml", "exp_1", str(launcher.root / "runs" / "b"))
    assert launcher("--no-attach", str(first)).returncode == 0
    launcher.records(2)

    out = launcher("--no-attach", str(second))

    assert out.returncode == 2, out.stdout + out.stderr
    assert f"session minilmd-exp_1 runs {first}, not {second}" in out.stderr
    assert "second argument" in out.stderr  # says how to start it anyway: a session name of its own
    assert len(launcher.records(2)) == 2  # nothing started for the second config
    assert launcher("--no-attach", str(second), "minilmd-exp_1-b").returncode == 0
    assert [r["argv"][1] for r in launcher.records(4) if r["argv"][0] == "run"] == [str(first), str(second)]


@pytest.mark.slow
def test_the_logs_window_follows_the_run_dir_the_supervisor_uses_when_run_dir_is_relative(tmp_path, corpus,
                                                                                           tmux_root):
    """A relative run.dir is relative to the config's directory (docs/operations.md). The launcher run from another
    directory joined it onto its own: window logs waited for ever on `CWD/runs/tmux` ("no such directory / waiting
    for it to become a run") while the supervisor ran in `CONFIG_DIR/runs/tmux`."""
    root, socket = tmux_root
    project = tmp_path / "relproj"
    project.mkdir()
    config = write_config(project, corpus, name="tmux", remote=False, run={"dir": "runs/tmux"},
                          train={"max_steps": 3, "checkpoint_every": 3})
    run_dir = project / "runs" / "tmux"
    env = env_for(FAKE_STEP_S="0.05", MINILMD=str(MINILMD), MINILMD_TMUX_SOCKET=socket, TMUX_TMPDIR=str(root))
    env = {k: v for k, v in env.items() if k != "TMUX"}
    out = subprocess.run(["bash", str(LAUNCHER), "--no-attach", str(config.relative_to(tmp_path))], capture_output=True,
                         text=True, timeout=120, env=env, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    wait_until(lambda: (run_dir / "state.json").exists() and state(run_dir)["phase"] == "done", 120,
               "the supervisor to run in CONFIG_DIR/runs/tmux to its end")
    wait_until(lambda: lock_holder(run_dir) is None, 60, "the supervisor to exit")

    def logs_screen() -> str:
        return subprocess.run(["tmux", "-L", socket, "capture-pane", "-p", "-J", "-S", "-", "-t",
                               "=minilmd-tmux:logs"], capture_output=True, text=True, timeout=30, env=env).stdout

    followed = f"==> {run_dir / 'supervisor.log'} <=="
    wait_until(lambda: followed in logs_screen(), 60, "window logs to follow the supervisor's run directory")
    assert f"{tmp_path / 'runs'}" not in logs_screen()  # never waited on the shell's directory
    assert not (tmp_path / "runs").exists()  # nothing ran beside the shell's directory



@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_the_header_on_stdout_and_exits_0(flag):
    """Before: one usage line on stderr, exit 2, as for a mistake; the header comment says what the launcher does
    and which environment it reads. No tmux is needed to read it."""
    out = subprocess.run(["bash", str(LAUNCHER), flag], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("minilmd-tmux.sh - run `minilmd run CONFIG` in a named tmux session"), lines[:3]
    assert "Usage: minilmd-tmux.sh [--no-attach] CONFIG [SESSION]" in lines and "Environment:" in lines, lines
    assert not any(line.startswith(("#", "set -")) for line in lines), lines
