"""The words of the views after a stop or an early stop (issue 24): the overview's PHASE says `stopped` and
`early-stopped`, not `done`; a stage waiting on a stopped predecessor says it "was stopped"; `stop` of a stage that
waits prints no empty reason and no `step None`; status shows one ETA."""
from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

from minilmd import names
from minilmd.daemon.runstate import new_state, process_start_ticks
from minilmd.daemon.views import overview, status
from minilmd.fsio import atomic_write_json
from minilmd.init_source import Predecessor, predecessor_outcome


def row(phase: str, reason: str, step: int, total: int) -> dict:
    return {"run": "r", "run_dir": "/x", "phase": phase, "reason": reason, "running": False, "step": step,
            "total_steps": total}


def test_the_overview_tells_stopped_and_early_stopped_from_done():
    lines = overview.table([row("done", "stopped on request", 129, 300),
                            row("done", "the run finished and its last checkpoint is synced", 129, 300),
                            row("done", "the run finished", 300, 300)])
    phases = [line.split()[1] for line in lines[1:]]
    assert phases == ["stopped", "early-stopped", "done"], lines


def test_a_stage_after_a_stopped_predecessor_says_it_was_stopped(tmp_path):
    state = new_state("pre", tmp_path, str(tmp_path / "pre.toml"))
    state.update(phase="done", reason="stopped on request", progress={"step": 129},
                 outcome={"exit": 0, "phase": "done", "time": time.time(), "reason": "stopped on request"})
    atomic_write_json(tmp_path / names.STATE, state)
    outcome, why = predecessor_outcome(Predecessor("pre", tmp_path, tmp_path / "ckpt"))
    assert (outcome, why) == ("waiting", "run pre was stopped at step 129")


class ReleaseOnPhase(io.StringIO):
    """`stop`'s output; once it has printed the waiting phase, the fake supervisor may exit (no sleeping)."""

    def __init__(self, release: Path):
        super().__init__()
        self.release = release

    def write(self, s: str) -> int:
        if "waiting_init" in s:
            self.release.touch()
        return super().write(s)


def test_stop_of_a_waiting_stage_prints_no_empty_reason_nor_step_none(tmp_path):
    release = tmp_path / "release"
    # a supervisor that waits (no checkpoint, no reason yet) and ends on SIGTERM once `stop` has reported its phase
    code = ("import os, signal, sys, time\n"
            "def bye(*_):\n"
            f"    while not os.path.exists({str(release)!r}): time.sleep(0.01)\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\n"
            "print('ready', flush=True)\n"
            "while True: time.sleep(1)\n")
    sup = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert sup.stdout is not None and sup.stdout.readline().strip() == "ready"
        state = new_state("stage", tmp_path, str(tmp_path / "stage.toml"))
        state.update(phase="waiting_init", reason="",
                     supervisor={"pid": sup.pid, "start_ticks": process_start_ticks(sup.pid), "host": ""})
        atomic_write_json(tmp_path / names.STATE, state)
        out = ReleaseOnPhase(release)
        status.stop(tmp_path, timeout=60, out=out)
    finally:
        sup.kill()
        sup.wait()
    text = out.getvalue()
    assert "  waiting_init\n" in text and "waiting_init: " not in text, text
    assert "step None" not in text and "no local checkpoint" in text, text
