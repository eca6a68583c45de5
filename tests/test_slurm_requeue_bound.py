"""A Slurm job whose last sync gives up is requeued at most requeue_bound.MAX_UNSYNCED_REQUEUES times in a row
(daemon/slurm/requeue_bound.py): a run.remote that stays refused made every requeued job wait its quarter hour and
requeue again, for ever. The next give-up ends the run failed for good (exit 79) without `scontrol requeue`, its
reason naming the kept copy, run.remote's error and what to do; a sync that puts a newer step on run.remote, or a
newer checkpoint, begins the count again. Each give-up is unsynced_end.plan as daemon/ending.py calls it, in a job
whose `scontrol` is a fake on PATH recording its calls; each start carries the count from the previous state.json
as daemon/runfiles.py does. And once a sync puts the kept step on run.remote, the copy and its directory go at once
(daemon/aftersync.py), not at the run's end."""
from __future__ import annotations

import json
from types import SimpleNamespace

from minilmd import protocol
from minilmd.daemon.aftersync import AfterSync
from minilmd.daemon.base.runstate import RunState
from minilmd.daemon.base.statesections import RemoteCheckpoint
from minilmd.daemon.jobs import keptcopy
from minilmd.daemon.slurm import requeue_bound, unsynced_end
from minilmd.daemon.slurm.job import Allocation, SlurmJob
from minilmd.names import step_name
from slurm_helpers import fake_scontrol
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - the fixture

REFUSED = "run.remote R: R/owner.json is another user's file (owned by uid 4242)"


class Run:
    """One run across its Slurm job's starts: scratch, run.dir, the state.json each start leaves."""

    def __init__(self, tmp_path, monkeypatch):
        env, self.calls = fake_scontrol(tmp_path, "42")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        (tmp_path / "run").mkdir(mode=0o700)
        self.cfg = SimpleNamespace(checkpoint_dir=tmp_path / "scratch" / "checkpoints", run_dir=tmp_path / "run",
                                   scratch_is_default=True, run=SimpleNamespace(remote="R"))
        self.path, self.left, self.events = tmp_path / "run" / "state.json", None, []
        self.state: RunState

    def start(self, remote_step: int) -> None:
        """A start of the job: its SlurmJob, then the previous state.json adopted and the count carried."""
        self.state = RunState(self.path, {})
        self.job = SlurmJob(Allocation("42", ["n1"], [0]), self.state, lambda *a, **k: None)
        if self.left is not None:
            self.state.adopt(self.left, None)
            requeue_bound.carry(self.state.slurm, self.left.get("slurm"))
        self.state.remote_checkpoint = RemoteCheckpoint(step=remote_step)

    def give_up(self, preempted: bool = False) -> unsynced_end.UnsyncedEnd:
        """The last sync gave up (`preempted`: failed as Slurm's USR1 preempted the job, the plan SlurmJob's first,
        as daemon/ending.py asks it): the plan, and the requeue when it says so; state.json left as the job's end."""
        sync = SimpleNamespace(syncer=SimpleNamespace(expected=EXPECTED))
        problem, words = f"the last sync waited 15 min: {REFUSED}", ""
        if preempted:
            self.job.preempt("USR1")
            problem = f"the last sync was refused: {REFUSED}"
            first = self.job.plan(False, 30, problem)
            assert first.unsynced and first.requeue, first  # before: failed, exit 1, never requeued
            words = first.reason
        end = unsynced_end.plan(self.job, self.cfg, sync, self.state, lambda *a, **k: self.events.append(a),
                                problem, words)
        if end.requeue:
            assert self.job.requeue() is None
        self.left = json.loads(json.dumps(self.state.data))
        return end

    def requeues(self) -> int:
        return self.calls.read_text().splitlines().count("requeue 42") if self.calls.exists() else 0


def _settle(after: AfterSync, staging_running: bool = False) -> None:
    """A tick of the loop, then the removal it began (in a thread: daemon/aftersync.py) waited for and said."""
    after.tick(staging_running)
    if after.removal is not None:
        assert after.removal.wait(120), "the kept copy's removal did not return"
        after.tick(staging_running)


def test_the_give_up_after_the_bound_is_not_requeued_and_ends_failed_saying_why_and_what_to_do(
        tmp_path, monkeypatch, weights):
    run = Run(tmp_path, monkeypatch)
    save(run.cfg.checkpoint_dir, 30, weights)
    for n in range(1, requeue_bound.MAX_UNSYNCED_REQUEUES + 1):
        run.start(remote_step=10)
        assert run.give_up().requeue, n
        assert run.requeues() == n and run.left["slurm"][requeue_bound.KEY]["count"] == n
    run.start(remote_step=10)
    end = run.give_up()
    kept = keptcopy.place(run.cfg)
    assert not end.requeue and end.exit == protocol.SUPERVISOR_GAVE_UP
    assert run.requeues() == requeue_bound.MAX_UNSYNCED_REQUEUES  # never asked a fourth time
    for words in (str(kept), "step 30", REFUSED, "fix run.remote", "resubmit the job",
                  f"after {requeue_bound.MAX_UNSYNCED_REQUEUES} requeue(s) in a row"):
        assert words in end.words, (words, end.words)
    assert (kept / step_name(30)).is_dir()  # the copy stays for the resubmitted job


def test_a_sync_between_give_ups_or_a_newer_checkpoint_begins_the_count_again(tmp_path, monkeypatch, weights):
    run = Run(tmp_path, monkeypatch)
    save(run.cfg.checkpoint_dir, 30, weights)
    for _ in range(requeue_bound.MAX_UNSYNCED_REQUEUES - 1):
        run.start(remote_step=10)
        assert run.give_up().requeue
    run.start(remote_step=10)  # the remote takes checkpoints again for a while: a periodic sync pushes step 30
    after = AfterSync(run.cfg, run.state, lambda *a, **k: run.events.append(a))
    run.state.remote_checkpoint = RemoteCheckpoint(step=30)
    _settle(after)
    assert requeue_bound.KEY not in run.state.slurm  # the count begins again at once
    assert not keptcopy.place(run.cfg).exists()  # the copy the remote has now goes, and its empty directory
    assert any("removed step 30" in e[1] for e in run.events), run.events
    save(run.cfg.checkpoint_dir, 40, weights)  # trained on; then the remote refuses again
    for n in range(1, requeue_bound.MAX_UNSYNCED_REQUEUES + 1):
        assert run.give_up().requeue, n  # the 3rd, 4th and 5th give-ups in all: requeued all the same
        run.start(remote_step=30)
    save(run.cfg.checkpoint_dir, 50, weights)  # progress without a sync: not a loop either
    assert run.give_up().requeue and run.left["slurm"][requeue_bound.KEY]["count"] == 1
    assert run.requeues() == 2 * requeue_bound.MAX_UNSYNCED_REQUEUES


def test_the_kept_copy_waits_for_its_own_step_and_for_staging(tmp_path, monkeypatch, weights):
    run = Run(tmp_path, monkeypatch)
    save(run.cfg.checkpoint_dir, 30, weights)
    run.start(remote_step=10)
    assert run.give_up().requeue
    run.start(remote_step=10)
    after = AfterSync(run.cfg, run.state, lambda *a, **k: run.events.append(a))
    run.state.remote_checkpoint = RemoteCheckpoint(step=20)  # older than the copy: it stays
    _settle(after)
    run.state.remote_checkpoint = RemoteCheckpoint(step=30)
    _settle(after, staging_running=True)  # staging's thread fetches or drops it: not two at once
    assert after.removal is None and (keptcopy.place(run.cfg) / step_name(30)).is_dir()
    _settle(after)
    assert not keptcopy.place(run.cfg).exists()


def test_a_preempted_job_whose_last_sync_failed_is_requeued_with_its_copy_within_the_same_bound(
        tmp_path, monkeypatch, weights):
    """Slurm's USR1 while run.remote refuses the run: its newest checkpoint kept in run.dir and the job requeued, as
    after the final sync's wait, counted in the same bound: the give-up after it ends failed, exit 79."""
    run = Run(tmp_path, monkeypatch)
    save(run.cfg.checkpoint_dir, 30, weights)
    for n in range(1, requeue_bound.MAX_UNSYNCED_REQUEUES + 1):
        run.start(remote_step=10)
        end = run.give_up(preempted=True)
        assert end.requeue and run.requeues() == n, (n, end)
        assert end.words.startswith("requeued by Slurm (preempted by USR1): the last sync failed"), end
        assert str(keptcopy.place(run.cfg) / step_name(30)) in end.words, end.words
        assert run.left["slurm"]["requeued"] and run.left["slurm"][requeue_bound.KEY]["count"] == n
    run.start(remote_step=10)
    end = run.give_up(preempted=True)
    assert not end.requeue and end.exit == protocol.SUPERVISOR_GAVE_UP, end
    assert run.requeues() == requeue_bound.MAX_UNSYNCED_REQUEUES and REFUSED in end.words
    assert (keptcopy.place(run.cfg) / step_name(30)).is_dir()  # the copy stays for the resubmitted job
