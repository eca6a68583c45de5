"""The words of the views after a stop or an early stop (issue 24): the overview's PHASE says `stopped` and
`early-stopped` (and a Slurm job's `requeued`, `cancelled`), not `done`; a stage waiting on a stopped predecessor
says it "was stopped"; `stop` of a stage that waits prints no empty reason and no `step None`; status shows one
ETA."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

from minilmd import names, protocol
from minilmd.daemon.base.runstate import new_state, process_start_ticks
from minilmd.daemon.views import overview, stop
from minilmd.fsio import atomic_write_json
from minilmd.init_source import Predecessor, predecessor_outcome


def row(phase: str, reason: str, step: int, total: int) -> dict:
    """A row of a run that ended with `reason` (as a state.json without outcome.ended, read by its words)."""
    left = {"phase": phase, "reason": reason, "progress": {"step": step, "total_steps": total},
            "outcome": {"exit": 0, "phase": phase, "reason": reason}}
    return {"run": "r", "run_dir": "/x", "phase": phase, "reason": reason, "running": False, "step": step,
            "total_steps": total, "ended": protocol.how_ended(left)}


def test_the_overview_tells_stopped_and_early_stopped_from_done():
    lines = overview.table([row("done", "stopped on request", 129, 300),
                            row("done", "the run finished and its last checkpoint is synced", 129, 300),
                            row("done", "the run finished", 300, 300),
                            row("done", "requeued by Slurm (preempted at step 129)", 129, 300),
                            row("done", "the Slurm job was cancelled: stopped at step 129, not requeued", 129, 300)])
    phases = [line.split()[1] for line in lines[1:]]
    assert phases == ["stopped", "early-stopped", "done", "requeued", "cancelled"], lines


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
    # (it holds the run lock and carries the run's identity, as `minilmd run` does: stop signals only such a one)
    code = ("import fcntl, json, os, signal, sys, time\n"
            f"fd = os.open({str(tmp_path / names.LOCK)!r}, os.O_RDWR | os.O_CREAT, 0o644)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, json.dumps({'pid': os.getpid(), 'host': '', 'launch_id': 'stage-sup'}).encode())\n"
            "def bye(*_):\n"
            f"    while not os.path.exists({str(release)!r}): time.sleep(0.01)\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\n"
            "print('ready', flush=True)\n"
            "while True: time.sleep(1)\n")
    env = {**os.environ, names.SUPERVISOR_RUN_DIR_ENV: str(tmp_path.resolve()), names.SUPERVISOR_ID_ENV: "stage-sup"}
    sup = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert sup.stdout is not None and sup.stdout.readline().strip() == "ready"
        state = new_state("stage", tmp_path, str(tmp_path / "stage.toml"))
        state.update(phase="waiting_init", reason="",
                     supervisor={"pid": sup.pid, "start_ticks": process_start_ticks(sup.pid), "host": ""})
        atomic_write_json(tmp_path / names.STATE, state)
        out = ReleaseOnPhase(release)
        stop.stop(tmp_path, timeout=60, out=out)
    finally:
        sup.kill()
        sup.wait()
    text = out.getvalue()
    assert "  waiting_init\n" in text and "waiting_init: " not in text, text
    assert "step None" not in text and "no local checkpoint" in text, text


# --- the train/val gap warning: overfitting, not a gap there from the start (issue 24) -----------------------------
def fit_records(per_epoch: list[tuple[list[float], list[float]]]) -> list[dict]:
    """metrics.jsonl lines: for each epoch, its train losses and its val losses (one eval each)."""
    out, step = [], 0
    for epoch, (trains, vals) in enumerate(per_epoch):
        for loss in trains:
            step += 1
            out.append({"kind": "train", "step": step, "epoch": epoch, "loss": loss})
        for val in vals:
            out.append({"kind": "eval", "step": step, "epoch": epoch, "val_loss": val})
    return out


def test_a_gap_there_from_the_start_with_a_flat_val_loss_is_not_overfitting():
    from minilmd.daemon.views.fitwatch import warnings

    # a LoRA run on another distribution: train 1.0, val 2.50 (gap 1.5 > 0.5) from epoch 0, val flat
    lora = fit_records([([1.1, 0.9, 1.0], [2.50, 2.49, 2.50])])
    assert warnings(lora, warn_rising=3, warn_gap=0.5) == []


def test_a_gap_that_grows_across_epochs_warns():
    from minilmd.daemon.views.fitwatch import warnings

    # epoch 0: train 2.0, val 2.1 (gap 0.1); epoch 2: train 0.5, val 2.0 (gap 1.5, grown by 1.4); val not rising
    grows = fit_records([([2.0, 2.0], [2.1]), ([1.2, 1.2], [2.05]), ([0.5, 0.5], [2.0])])
    found = warnings(grows, warn_rising=3, warn_gap=0.5)
    assert found == ["train/val gap 1.500 > 0.5 in epoch 2 (train 0.5000, val 2.0000; grown from 0.100 in "
                     "epoch 0)"], found
