"""A preempted Slurm job whose last sync failed asks `scontrol show job` once, within SIGNAL_TIMEOUT_S, for both
its plan (daemon/slurm/job.py: whether Slurm requeues it itself, or it is cancelled) and whether it may be requeued
(daemon/slurm/unsynced_end.py requeueable: Requeue=0). Before, the plan asked with scontrol's 10 s runner and
requeueable asked again (3 s), then `scontrol requeue` (10 s): 23 s of bounds where jobend.REQUEUE_MARGIN_S counts
15. The two runners here are fakes recording what each was asked."""
from __future__ import annotations

import pytest

from minilmd.daemon.slurm import unsynced_end
from minilmd.daemon.slurm.job import Allocation, SlurmJob


class Scontrol:
    """Answers `scontrol show job -o` with `job`; records every call."""

    def __init__(self, job: str):
        self.job, self.calls = job, []

    def __call__(self, args: list[str]) -> str:
        self.calls.append(args)
        return f"JobId={args[-1]} {self.job}\n" if args[:3] == ["scontrol", "show", "job"] else ""

    def asked_job(self) -> int:
        return sum(1 for args in self.calls if args[:3] == ["scontrol", "show", "job"])


@pytest.mark.parametrize("requeue, may", [("1", True), ("0", False)])
def test_a_preempted_job_whose_last_sync_failed_asks_scontrol_once_within_the_signals_bound(requeue, may):
    line = f"JobState=RUNNING Reason=None Restarts=0 Requeue={requeue}"
    slow, quick = Scontrol(line), Scontrol(line)  # scontrol's 10 s runner, and the one bounded at 3 s
    job = SlurmJob(Allocation("42", ["n1"], [0]), {}, lambda *a, **k: None, slow, quick)
    asked_at_start = slow.asked_job()
    job.preempted_by = "USR1"  # as preempt() sets it (its background watch of the job's end is not this test's)
    plan = job.plan(False, 30, "the last sync failed: remote unreachable")
    assert plan.unsynced and plan.requeue, plan
    assert unsynced_end.requeueable(job, preempted=True) == may
    assert slow.asked_job() == asked_at_start, slow.calls  # never the slow runner after the preemption
    assert quick.asked_job() == 1, quick.calls  # asked once, for both
