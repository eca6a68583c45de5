"""`minilmd status RUN` in the words `status --all` uses: a run stopped on request reads `stopped` in both (it read
`done ... why: stopped on request` beside the overview's `stopped`), an early-stopped one `early-stopped`; and the
why of a training run says it trains, not only how training began (`first heartbeat from attempt 1 (step 0)` was
the why all run long, at step 331 too)."""
from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.host.registry import Entry
from minilmd.daemon.views import overview
from minilmd.daemon.views import status as views
from minilmd.fsio import atomic_write_json


def _run(tmp_path: Path, **fields) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    st = new_state("tiny", run_dir, "tiny.toml")
    st.update(**fields)
    atomic_write_json(run_dir / names.STATE, st)
    return run_dir


def _status(run_dir: Path) -> list[str]:
    out = io.StringIO()
    assert views.status(run_dir, out=out) == 0
    return out.getvalue().splitlines()


def _overview_phase(run_dir: Path) -> str:
    entry = Entry("tiny", run_dir, "tiny.toml", os.getuid(), run_dir / "entry")
    return overview.shown_phase(overview.row(entry, time.time()))


@pytest.mark.parametrize(("reason", "ended", "word"), [("stopped on request", "stopped", "stopped"),
                                                      ("finished", "finished", "early-stopped")])
def test_an_ended_run_reads_as_the_overview_says_how_it_ended(tmp_path, reason, ended, word):
    run_dir = _run(tmp_path, phase="done", reason=reason,
                   supervisor={"pid": 999999, "start_ticks": 1, "host": "h"},
                   progress={"step": 40, "total_steps": 100},
                   outcome={"exit": 0, "phase": "done", "time": time.time(), "reason": reason, "ended": ended})
    head = _status(run_dir)[0]
    assert _overview_phase(run_dir) == word
    assert head.startswith(f"run tiny ({run_dir}): {word} for "), head  # the word, not "done"


def test_the_why_of_a_training_run_says_it_trains(tmp_path):
    run_dir = _run(tmp_path, phase="training", reason="first heartbeat from attempt 1 (step 0)",
                   progress={"step": 331, "total_steps": 1000})  # new_state's supervisor: this process, alive
    lines = _status(run_dir)
    assert "  why: training, since the first heartbeat from attempt 1 (step 0)" in lines, lines
