"""A stop that comes during the last sync of a run whose trainer finished does not undo the finish.

Observed before (reports fault8 F1): a run at its budget (trainer exit 0) whose last sync was slow got `minilmd stop`;
the sync completed (the last step on the remote, verified), but state.json said outcome.ended "stopped", and a later
stage whose init.from named the run waited for ever ("run LS1 was stopped at step 200; the run waits for it to
finish"). A rerun said "done, nothing to do" and left the record as it was. daemon/ending.py `_finish` tested the stop
before the trainer's end; protocol.how_ended now also reads such a record left by that version as finished.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from minilmd import names, protocol
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.phases import initwait
from minilmd.fsio import atomic_write_json
from minilmd.init_source import Predecessor, predecessor_report, resolve
from supervisor_helpers import start_supervisor, state, wait_or_kill, write_config
from waiting import wait_until


@pytest.mark.slow
@pytest.mark.fuse
def test_a_stop_during_the_last_sync_of_a_finished_run_leaves_it_finished_for_the_stage_after_it(
        tmp_path, corpus, faultfs):
    first = write_config(tmp_path, corpus, name="pre", remote=False, run={"remote": str(faultfs.root / "remote")})
    stage = load_config(write_config(tmp_path, corpus, name="sft", init={"from": str(first)}))
    run_dir = load_config(first).run_dir
    faultfs.stall("*step-00000030*", 600, op="write")  # only the final checkpoint's copy is held
    sup = start_supervisor(first, tmp_path / "pre.out")
    try:
        wait_until(lambda: faultfs.hits("stall") and state(run_dir).get("phase") == "stopping", timeout=180,
                   what="the last sync of step 30 held")
        assert "the trainer finished" in state(run_dir)["reason"], state(run_dir)["reason"]
        sup.send_signal(signal.SIGTERM)  # `minilmd stop`'s signal, during the last sync
        wait_until(lambda: "stop requested" in (tmp_path / "pre.out").read_text(), timeout=60, what="the stop taken")
        faultfs.clear()
        assert wait_or_kill(sup, 300) == 0, (tmp_path / "pre.out").read_text()[-3000:]
    finally:
        faultfs.clear()
        wait_or_kill(sup, 1) if sup.poll() is None else None
    left = state(run_dir)
    assert left["remote_checkpoint"]["step"] == 30, left["remote_checkpoint"]
    assert left["outcome"]["ended"] == "finished" and left["outcome"]["exit"] == 0, left["outcome"]
    assert protocol.how_ended(left) == "finished"

    report = predecessor_report(Predecessor("pre", run_dir, Path(stage.init.from_)))
    assert report.outcome == "done", report
    assert not initwait.must_wait(stage)  # the stage's init wait: it starts from the final checkpoint
    assert resolve(str(first)).path.name == "step-00000030"


def stopped_record(tmp: Path, step: int, remote_step: int, total: int = 200) -> Predecessor:
    """A predecessor's state.json as the version before left a stop during its last sync: outcome "stopped"."""
    body = new_state("pre", tmp, str(tmp / "pre.toml"))
    reason = "stopped on request"
    body.update(phase="done", reason=reason, progress={"step": step, "total_steps": total},
                remote_checkpoint={"step": remote_step, "path": str(tmp / "remote" / names.step_name(remote_step)),
                                   "verified": True},
                outcome={"exit": 0, "phase": "done", "time": time.time(), "reason": reason, "ended": "stopped"})
    atomic_write_json(tmp / names.STATE, body)
    return Predecessor("pre", tmp, tmp / "remote")


@pytest.mark.parametrize("step, remote_step, ended, outcome", [
    (200, 200, "finished", "done"),  # its last step at the budget and on the remote: it finished
    (200, 150, "stopped", "waiting"),  # the last sync cut: the next start syncs it and ends
    (150, 150, "stopped", "waiting"),  # stopped before its budget: a restart trains on
])
def test_a_stopped_record_of_a_run_whose_last_step_is_synced_at_its_budget_reads_finished(
        tmp_path, step, remote_step, ended, outcome):
    pred = stopped_record(tmp_path, step, remote_step)
    assert protocol.how_ended(state(tmp_path)) == ended
    assert predecessor_report(pred).outcome == outcome
