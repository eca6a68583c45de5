"""How a run ended is a field of state.json's outcome, not a guess from its reason's words.

Before: a stage's init wait (init_source.predecessor_report) took any `done` with exit 0 whose reason did not start
with "stopped" for a finished run. A Slurm job requeued by Slurm itself ("requeued by Slurm ...") or cancelled
("the Slurm job was cancelled: stopped at step ...") ends its supervisor `done` with exit 0 too: the next stage
then started from the checkpoint of a run that had not finished. Now the supervisor records `outcome.ended`
(finished, stopped, requeued, cancelled, failed) where it ends, and one core function (minilmd/protocol.py
`how_ended`) reads it, falling back to the reason's words only for a state.json written before the field.
"""
from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest

from minilmd import names, protocol
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.phases import initwait
from minilmd.fsio import atomic_write_json
from minilmd.init_source import InitSourceError, Predecessor, predecessor_report, resolve
from supervisor_helpers import start_supervisor, state, wait_or_kill, write_config
from waiting import wait_until

FAKE_SCONTROL = """#!/bin/sh
# scontrol as a Slurm job's supervisor asks it: its node list, its job line (from $FAKE_SLURM_JOB), a requeue
case "$1 $2" in
  "show hostnames") echo node01 ;;
  "show job") echo "JobId=$4 $FAKE_SLURM_JOB" ;;
  "requeue ") echo "requeue $2" >> "$FAKE_SLURM_CALLS" ;;
esac
"""


def slurm_env(tmp: Path, job_line: str) -> dict:
    """The environment of `minilmd run` in Slurm job 42 (its first start), with a fake scontrol on PATH."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(FAKE_SCONTROL)
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    (tmp / "node-tmp").mkdir()
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", names.SLURM_JOB_ENV: "42", "SLURM_JOB_NODELIST": "node01",
            "SLURM_RESTART_COUNT": "0", "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp / "node-tmp"),
            "FAKE_SLURM_JOB": job_line, "FAKE_SLURM_CALLS": str(tmp / "scontrol-calls"), "FAKE_STEP_S": "0.05"}


@pytest.mark.slow  # a real supervisor and the fake trainer, ended by a SIGTERM after its first synced checkpoint
@pytest.mark.parametrize("job_line, ended, reason", [
    ("JobState=COMPLETING Reason=None Restarts=1", "requeued", "requeued by Slurm (preempted at step "),
    ("JobState=COMPLETING Reason=None Restarts=0", "cancelled", "the Slurm job was cancelled: stopped at step "),
])
def test_a_slurm_run_requeued_or_cancelled_is_not_finished_for_the_stage_after_it(tmp_path, corpus, job_line,
                                                                                  ended, reason):
    first = write_config(tmp_path, corpus, name="pre", train={"max_steps": 100_000, "checkpoint_every": 5})
    stage = load_config(write_config(tmp_path, corpus, name="sft", init={"from": str(first)}))
    run_dir = load_config(first).run_dir
    sup = start_supervisor(first, tmp_path / "pre.out", **slurm_env(tmp_path, job_line))
    try:
        wait_until(lambda: (state(run_dir).get("remote_checkpoint") or {}).get("step"), timeout=120,
                   what="a checkpoint synced to the remote")
        sup.send_signal(signal.SIGTERM)  # Slurm's SIGTERM: its job line says requeued by Slurm, or cancelled
        assert wait_or_kill(sup, 180) == 0
    finally:
        wait_or_kill(sup, 1) if sup.poll() is None else None
    left = state(run_dir)
    assert left["phase"] == "done" and left["reason"].startswith(reason), left["reason"]
    assert not (tmp_path / "scontrol-calls").exists()  # neither is requeued by this supervisor

    report = predecessor_report(Predecessor("pre", run_dir, Path(stage.init.from_)))
    assert report.outcome == "waiting", report
    poll = initwait.poll_predecessor(stage)  # the stage's init wait: it waits, never starts from this checkpoint
    assert poll.report is not None and poll.report.outcome == "waiting", poll.report
    with pytest.raises(InitSourceError, match="has not finished"):
        resolve(str(first))
    assert left["outcome"]["ended"] == ended and left["outcome"]["exit"] == 0, left["outcome"]


def predecessor_left(tmp: Path, phase: str, reason: str, step: int = 129, total: int = 300, **outcome) -> Predecessor:
    """A predecessor's state.json as a supervisor of the version before outcome.ended left it (or with `outcome`'s
    fields added)."""
    body = new_state("pre", tmp, str(tmp / "pre.toml"))
    body.update(phase=phase, reason=reason, progress={"step": step, "total_steps": total},
                outcome={"exit": 0, "phase": phase, "time": time.time(), "reason": reason, **outcome})
    atomic_write_json(tmp / names.STATE, body)
    return Predecessor("pre", tmp, tmp / "ckpt")


@pytest.mark.parametrize("reason, step, ended, outcome", [
    ("requeued by Slurm (preempted at step 129; Slurm requeued it itself)", 129, "requeued", "waiting"),
    ("requeued by Slurm (preempted at step 129)", 129, "requeued", "waiting"),
    ("the Slurm job was cancelled: stopped at step 129, not requeued", 129, "cancelled", "waiting"),
    ("stopped on request", 129, "stopped", "waiting"),
    ("the run finished as Slurm preempted it (USR1): not requeued", 300, "finished", "done"),
    ("the run finished and its last checkpoint is synced", 300, "finished", "done"),
    ("the run finished and its last checkpoint is synced", 129, "early_stopped", "done"),
])
def test_a_state_json_of_an_older_version_is_read_by_its_reason_words(tmp_path, reason, step, ended, outcome):
    pred = predecessor_left(tmp_path, "done", reason, step)
    assert protocol.how_ended(state(tmp_path)) == ended
    assert predecessor_report(pred).outcome == outcome


def test_the_recorded_ending_wins_over_the_reason_words(tmp_path):
    """Whatever words a reason takes (a new "stopped on request" variant, say), outcome.ended decides."""
    pred = predecessor_left(tmp_path, "done", "the run finished, or so it says", step=300, ended="cancelled")
    assert protocol.how_ended(state(tmp_path)) == "cancelled" and predecessor_report(pred).outcome == "waiting"
    pred = predecessor_left(tmp_path, "done", "stopped, in words of a later version", step=300, ended="finished")
    assert protocol.how_ended(state(tmp_path)) == "finished" and predecessor_report(pred).outcome == "done"


def test_a_run_without_an_outcome_has_not_ended_and_a_failed_one_failed():
    """No outcome: its supervisor runs, or was killed (None); an older failed one is failed whatever its words; a
    value of the wrong type anywhere is no answer beyond what the rest says."""
    assert protocol.how_ended({"phase": "done", "reason": "the run finished"}) is None
    assert protocol.how_ended({"phase": "done", "outcome": "finished"}) is None
    assert protocol.how_ended({"phase": "failed", "reason": "stopped, but ...", "outcome": {"exit": 79}}) == "failed"
    assert protocol.how_ended({"phase": "done", "reason": 7, "outcome": {"ended": ["stopped"]},
                               "progress": {"step": True, "total_steps": 9}}) == "finished"
    assert protocol.how_ended({"phase": "done", "outcome": {"ended": "finished"},
                               "progress": {"step": 3, "total_steps": 9}}) == "early_stopped"
