"""The tmux launcher runs `minilmd run CONFIG --check` before it starts anything: a config the supervisor would
refuse makes the launcher exit with --check's status and message, and no tmux session is left behind with the
error in a dead pane. The real minilmd of this venv does the check."""
from __future__ import annotations

import os
import signal

import pytest

from deploy_helpers import MINILMD, launcher, launcher_config  # noqa: F401 - the launcher fixture, shared


def test_a_bad_config_is_refused_with_the_checks_message_and_nothing_starts(launcher):
    bad = launcher_config(launcher.root / "bad.toml", "x", str(launcher.root / "runs" / "x"))
    bad.write_text(bad.read_text() + "[train]\nlr = -1\nno_such_key = 3\n")
    result = launcher("--no-attach", str(bad), MINILMD=str(MINILMD))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no_such_key" in result.stderr and "--check` refused it (exit 2)" in result.stderr
    assert launcher.tmux("list-sessions").returncode != 0  # no session, no dead pane


@pytest.mark.slow
def test_a_dead_supervisor_window_is_checked_again_before_it_is_restarted(launcher):
    config = launcher_config(launcher.root / "c.toml", "c", str(launcher.root / "runs" / "c"))
    assert launcher("--no-attach", str(config)).returncode == 0  # the stand-in minilmd accepts it
    (run_pid,) = [pid for _, name, pid, _ in launcher.windows("minilmd-c") if name == "run"]
    os.kill(run_pid, signal.SIGTERM)
    launcher.wait_dead("minilmd-c", "run")
    config.write_text(config.read_text() + "[train]\nno_such_key = 3\n")
    result = launcher("--no-attach", str(config), MINILMD=str(MINILMD))
    assert result.returncode == 2 and "no_such_key" in result.stderr
    assert [dead for _, name, _, dead in launcher.windows("minilmd-c") if name == "run"] == [True]
