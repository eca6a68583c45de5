"""A finished run's last sync waiting (run.remote's owner record, room) in a Slurm job (review11a F1): the wait holds
the allocation, so it is bounded (daemon/slurm/lastsynccut.py FINAL_SYNC_WAIT_S), and a preemption's plan never ends
such a run `finished`. The real supervisor's case: tests/test_remote_claim_lost.py (Slurm's USR1 during the wait)."""
from __future__ import annotations

from minilmd.daemon.slurm import lastsynccut
from minilmd.daemon.slurm.job import Allocation, SlurmJob

REFUSED = "the last sync was refused: sync to /r refused: /r/owner.json is another user's file (owned by uid 65534)"


def test_a_finished_runs_unsynced_last_checkpoint_is_never_planned_finished():
    job = SlurmJob(Allocation("4242", ["n1"], [0]), {}, lambda *a, **k: None,
                   runner=lambda args: "JobState=RUNNING Restarts=0",
                   signal_runner=lambda args: "JobState=RUNNING Restarts=0")
    job.preempted_by = "USR1"
    plan = job.plan(True, 30, REFUSED)
    assert plan.ended == "failed" and plan.problem and "refused" in plan.problem, plan
    assert plan.unsynced, plan  # requeued, its checkpoint kept in run.dir: daemon/slurm/unsynced_end.py decides


def test_the_final_sync_wait_is_bounded_in_a_slurm_job_only():
    job = SlurmJob(Allocation("4242", ["n1"], [0]), {}, lambda *a, **k: None, runner=lambda args: "")
    late = 1000.0 + lastsynccut.FINAL_SYNC_WAIT_S
    assert lastsynccut.may_wait(job, 1000.0, clock=lambda: 1000.0 + 60)
    assert not lastsynccut.may_wait(job, 1000.0, clock=lambda: late)
    assert lastsynccut.may_wait(None, 1000.0, clock=lambda: late)  # one server: the wait holds nothing else
