"""A preempted Slurm job's last sync is cut at the job's end, so that `scontrol requeue` still runs
(daemon/slurm/jobend.py, daemon/slurm/lastsynccut.py).

Before: the last sync of a preempted job was waited for while it moved, however long (daemon/jobs/syncworker.py
`final_sync`); under Slurm a copy slower than the warning's lead ended with the job SIGKILLed at its end time, before
`scontrol requeue`: the job was never requeued and state.json kept saying the sync ran. Now the job's end is asked
from the signal on (scontrol's EndTime, SLURM_JOB_END_TIME, else the warning's lead; tests/test_slurm_end_watch.py:
a scontrol that answers late) and a last sync still copying
REQUEUE_MARGIN_S before it is abandoned: nothing of it is put in place, the remote keeps its previous checkpoint,
and the job is requeued, its reason saying where the requeued job resumes. The clock here is a fake one; `scontrol`
a fake runner, or a script on PATH.
"""
from __future__ import annotations

import os
import re
import stat
import threading
import time
from pathlib import Path

import pytest

from held_sync import last_sync_running
from minilmd import checkpoint as ck
from minilmd import checkpoint_dirs
from minilmd.daemon.base.worker import ReadWatch
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import SyncAbandoned
from minilmd.daemon.slurm import job as slurm
from minilmd.daemon.slurm import jobend, lastsynccut
from sync_helpers import EXPECTED, dirs, save, weights  # noqa: F401 - dirs, weights: fixtures
from waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
T0 = 1_800_000_000.0  # the fake clock's preemption


class FakeScontrol:
    """`scontrol show job -o` answered with `job`; every call recorded."""

    def __init__(self, job: str = "JobState=RUNNING Reason=None Restarts=0"):
        self.job, self.calls = job, []

    def __call__(self, args: list[str]) -> str:
        self.calls.append(args)
        return f"JobId={args[-1]} {self.job}\n" if args[:3] == ["scontrol", "show", "job"] else ""


class Events(list):
    def __call__(self, kind, message, **details):
        self.append((kind, message))


def answered(job: slurm.SlurmJob) -> None:
    """Wait until the preempted job's end is asked (daemon/slurm/endwatch.py: in the background)."""
    wait_until(lambda: job.end_watch is not None and job.end_watch.settled, 60, "scontrol asked for the job's end")


def iso(ts: float) -> str:
    """A time as scontrol shows EndTime: local, no zone."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))


def test_the_jobs_end_is_the_earlier_of_scontrol_and_the_environment_else_the_warnings_lead():
    line = {"EndTime": iso(T0 + 250)}
    assert jobend.read({}, line, "USR1", T0) == jobend.JobEnd(T0 + 250, "scontrol's EndTime")
    assert jobend.read({"SLURM_JOB_END_TIME": str(int(T0 + 280))}, {}, "USR1", T0).at == T0 + 280
    # a preemption with a grace time moved the end earlier than the environment's, set at the job's start
    both = jobend.read({"SLURM_JOB_END_TIME": str(int(T0 + 280))}, line, "USR1", T0)
    assert both.at == T0 + 250 and both.deadline == T0 + 250 - jobend.REQUEUE_MARGIN_S
    lead = jobend.read({}, {"EndTime": "Unknown"}, "USR1", T0)  # neither: the warning's lead
    assert lead.at == T0 + jobend.WARNING_S and "USR1" in lead.source
    assert jobend.read({}, {}, "SIGTERM", T0).at == T0 + jobend.KILL_WAIT_S
    # `minilmd stop`'s SIGUSR2 ends no job: no end guessed, so no save or last sync cut (a known end still counts)
    assert jobend.read({}, {}, "SIGUSR2", T0).deadline is None
    assert jobend.read({}, line, "SIGUSR2", T0).at == T0 + 250
    # the time limit reached: Slurm's SIGTERM, then its SIGKILL after KillWait
    reached = jobend.read({}, {"EndTime": iso(T0 - 1)}, "SIGTERM", T0)
    assert reached.at == T0 + jobend.KILL_WAIT_S and "KillWait" in reached.source
    unlimited = jobend.read({}, {"EndTime": iso(T0 + 10 * 365 * 86400)}, "USR1", T0)
    assert unlimited.at is None and unlimited.deadline is None and "no end" in unlimited.words()


def test_the_warnings_lead_is_the_job_scripts():
    for script in (REPO / "deploy" / "slurm").glob("*.sbatch"):
        leads = re.findall(r"^#SBATCH --signal=B:USR1@(\d+)$", script.read_text(), re.M)
        assert leads == [str(int(jobend.WARNING_S))], script


FAKE_SCONTROL = """#!/bin/sh
# scontrol show job -o JOB: the job line, EndTime included, from $FAKE_SLURM_JOB; each call counted
echo "$*" >> "$FAKE_SLURM_CALLS"
case "$1 $2" in
  "show job") echo "JobId=$4 $FAKE_SLURM_JOB" ;;
esac
"""


def test_the_jobs_end_is_asked_of_scontrol_on_path_once(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(stat.S_IRWXU)
    end = time.time() + 200
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_JOB", f"JobState=RUNNING Reason=None Restarts=0 EndTime={iso(end)}")
    monkeypatch.setenv("FAKE_SLURM_CALLS", str(tmp_path / "calls"))
    events = Events()
    job = slurm.SlurmJob(slurm.Allocation("42", ["node01"], []), {}, events, environ={})
    assert job.preempt("USR1")
    answered(job)
    first = job.job_end()
    assert job.job_end() == first and abs((first.at or 0) - int(end)) <= 1, first
    asked = (tmp_path / "calls").read_text().splitlines()
    assert asked == ["show job -o 42", "show job -o 42"], asked  # one at the job's start, one for its end
    assert [m for k, m in events if k == "slurm" and m.startswith(f"the job ends at {jobend.clock(first.at)}")]


class Clock:
    def __init__(self, at: float):
        self.at = at

    def __call__(self) -> float:
        return self.at


def test_a_last_sync_still_copying_at_the_jobs_end_is_abandoned_and_the_job_requeued(tmp_path):
    line = f"JobState=RUNNING Reason=None Restarts=0 EndTime={iso(T0 + 100)}"
    runner, short = FakeScontrol(line), FakeScontrol(line)  # short: the runner of the shorter bound
    job = slurm.SlurmJob(slurm.Allocation("42", ["node01"], []), {}, Events(), runner, signal_runner=short,
                         environ={})
    job.preempt("USR1")
    job.preempted_at = T0
    answered(job)
    clock = Clock(T0 + 10)
    with last_sync_running(tmp_path) as (sync, syncer, said):
        emit = lambda kind, message, **d: said.append(message)
        sync.state.remote_checkpoint = None
        assert lastsynccut.due(job, sync, sync.cfg, sync.state, emit, clock) is None  # long before: waited for
        assert sync.worker is not None and not syncer.__dict__.get("abandoned")
        clock.at = T0 + 100 - jobend.REQUEUE_MARGIN_S  # the deadline
        words = lastsynccut.due(job, sync, sync.cfg, sync.state, emit, clock) or ""
        assert words.startswith("last sync cut at the job's end: run.remote holds no checkpoint of this run; the "
                                "next start begins at step 0, or from scratch's step 4 if it runs on this node")
        assert sync.worker is None and syncer.abandoned == words  # its copy stops at its next chunk
        assert sync.state.sync.state == "failed" and sync.state.sync.error == words
        assert [m for m in said if m.startswith(words) and "abandoned" in m], said
        assert lastsynccut.due(job, sync, sync.cfg, sync.state, emit, clock) == words  # cut once, said once
    asked = len(runner.calls)
    plan = job.plan(False, None, words)
    assert runner.calls[asked:] == [] and short.calls == [["scontrol", "show", "job", "-o", "42"]] * 2  # end, plan
    assert plan.requeue and plan.problem is None and plan.ended == "requeued" and words in plan.reason
    assert job.state["slurm"]["last_sync_cut"] == words
    finished = job.plan(True, None, words)  # the budget done, its last checkpoint not synced: requeued to sync it
    assert finished.requeue and "the requeued job syncs its last checkpoint" in finished.reason


def test_outside_a_preemption_or_before_the_deadline_the_last_sync_is_never_cut(tmp_path):
    job = slurm.SlurmJob(slurm.Allocation("42", ["node01"], []), {}, Events(), FakeScontrol(), environ={})
    with last_sync_running(tmp_path) as (sync, syncer, said):
        late = Clock(time.time() + 10 * jobend.WARNING_S)
        assert lastsynccut.due(job, sync, sync.cfg, sync.state, said.append, late) is None  # not preempted
        job.preempt("USR1")  # no end known: the warning's lead from now
        assert lastsynccut.due(job, sync, sync.cfg, sync.state, said.append, Clock(time.time())) is None
        assert sync.worker is not None and not syncer.__dict__.get("abandoned")


def test_words_of_a_cut_name_the_remotes_step_and_scratchs(tmp_path):
    behind = lastsynccut.cut_words(20, 30, tmp_path)
    assert behind.startswith("last sync cut at the job's end: run.remote keeps step 20; the next start resumes "
                             "from it, or from scratch's step 30 if it runs on this node")
    assert "the newest" in lastsynccut.cut_words(30, 30, tmp_path)


class HeldWatch(ReadWatch):
    """A ReadWatch whose first chunk holds the copy until `go` is set: the sync is mid-copy meanwhile."""

    def __init__(self):
        super().__init__()
        self.held, self.go = threading.Event(), threading.Event()

    def answer(self, nbytes: int = 0) -> None:
        super().answer(nbytes)
        if nbytes and not self.held.is_set():
            self.held.set()
            self.go.wait(60)


def test_an_abandoned_copy_stops_before_it_is_put_in_place_and_removes_its_half_copy(dirs, weights):
    local, remote = dirs
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED).sync_newest()
    save(local, 20, weights)
    syncer = Syncer(local, str(remote), EXPECTED)
    syncer.watch = watch = HeldWatch()
    outcome: list[BaseException] = []
    copy = threading.Thread(target=lambda: outcome.append(pytest.raises(SyncAbandoned, syncer.sync_newest).value))
    copy.start()
    assert watch.held.wait(60), "the copy never began"
    assert [p.name for p in remote.iterdir() if p.name.startswith(".tmp-step-00000020")], "no half copy"
    syncer.abandoned = "the job's end is near"
    watch.go.set()
    copy.join(60)
    assert not copy.is_alive() and outcome, "the copy went on after it was abandoned"
    assert "abandoned: the job's end is near" in str(outcome[0]), outcome
    assert sorted(p.name for p in remote.iterdir() if not p.name.startswith(".")) == ["LATEST", "step-00000010"]
    assert not [p for p in remote.iterdir() if p.name.startswith(".tmp-")], list(remote.iterdir())
    assert checkpoint_dirs.read_latest(remote) == "step-00000010"
    ck.validate(remote / "step-00000010", EXPECTED)


# --- review9a: the end asked at the signal, in a known format; a stop request; an abandon after the last chunk -------

def test_the_jobs_end_is_asked_at_the_signal_within_the_short_bound():
    """Before: asked on the first stopping tick after the trainer's save, with the 10 s runner, eating the margin."""
    line = f"JobState=RUNNING Reason=None Restarts=0 EndTime={iso(T0 + 250)}"
    runner, short = FakeScontrol(line), FakeScontrol(line)
    job = slurm.SlurmJob(slurm.Allocation("42", ["node01"], []), {}, Events(), runner, signal_runner=short,
                         environ={})
    assert runner.calls == [["scontrol", "show", "job", "-o", "42"]]  # the job's start
    assert job.preempt("USR1") and not job.preempt("SIGTERM")
    answered(job)
    assert short.calls == [["scontrol", "show", "job", "-o", "42"]] and len(runner.calls) == 1
    assert job.job_end().at == T0 + 250 and len(short.calls) == 1


TIME_FORMAT_SCONTROL = """#!/bin/sh
# EndTime as a real scontrol prints it under $SLURM_TIME_FORMAT (scontrol(1) ENVIRONMENT)
case "$SLURM_TIME_FORMAT" in
  "%s") end="$FAKE_END_EPOCH" ;;
  relative) end="Tomorr 04:00" ;;
  "") end="$FAKE_END_ISO" ;;
  *) end="06.12 04:00" ;;
esac
echo "JobId=$4 JobState=RUNNING Reason=None Restarts=0 EndTime=$end"
"""


@pytest.mark.parametrize("users_format", ["relative", "%d.%m %H:%M"])
def test_end_time_is_read_whatever_time_format_the_user_set(tmp_path, monkeypatch, users_format):
    """Before: scontrol ran in the user's SLURM_TIME_FORMAT, EndTime was not read and a SIGTERM's end fell back to
    KillWait's 30 s, cutting a long grace's last sync at once. Now it is asked as epoch seconds."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(TIME_FORMAT_SCONTROL)
    (bin_dir / "scontrol").chmod(stat.S_IRWXU)
    end = int(time.time()) + 600
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_TIME_FORMAT", users_format)
    monkeypatch.setenv("FAKE_END_EPOCH", str(end))
    job = slurm.SlurmJob(slurm.Allocation("42", ["node01"], []), {}, Events(), environ={})
    job.preempt("SIGTERM")
    answered(job)
    assert job.job_end() == jobend.JobEnd(float(end), "scontrol's EndTime"), job.job_end()
    # a Slurm that ignores the format prints local time: read as before
    assert jobend.read({}, {"EndTime": iso(T0 + 60)}, "SIGTERM", T0).at == T0 + 60


def test_a_stop_request_in_a_slurm_job_with_no_end_told_cuts_no_sync(tmp_path):
    """`minilmd stop`'s SIGTERM in a Slurm job, scontrol silent, no SLURM_JOB_END_TIME: before, the KillWait guess
    cut the last sync 10 s after the stop and the run ended `stopped`, exit 0, with its last sync not done."""
    from minilmd.daemon.base import stoprequest

    job = slurm.SlurmJob(slurm.Allocation("42", ["node01"], []), {}, Events(), FakeScontrol(), environ={})
    job.preempt("SIGTERM")
    assert job.job_end().guessed
    late = Clock(time.time() + 10 * jobend.WARNING_S)
    with last_sync_running(tmp_path) as (sync, syncer, said):
        sync.cfg.run.dir = str(tmp_path / "run")
        (tmp_path / "run").mkdir()
        stoprequest.leave(tmp_path / "run", os.getuid())
        assert lastsynccut.due(job, sync, sync.cfg, sync.state, Events(), late) is None
        assert sync.worker is not None and not syncer.__dict__.get("abandoned")
        for leftover in (tmp_path / "run").iterdir():  # the request, whatever its name: a SIGTERM of Slurm's now
            leftover.unlink()
        assert lastsynccut.due(job, sync, sync.cfg, sync.state, Events(), late)  # Slurm's SIGTERM: cut
    # a stop whose sync was cut says where the next start resumes, never a requeued job
    stopped = job.plan(False, 4, job.sync_cut, stop_asked="minilmd stop by root")
    assert stopped.ended == "stopped" and "not requeued; last sync cut" in stopped.reason, stopped
    assert "requeued job" not in stopped.reason and "the next start" in stopped.reason, stopped


class PuttingWatch(ReadWatch):
    """The supervisor abandons the sync just after its last chunk was read back, as it is put in place."""

    syncer: Syncer

    def reading(self, what: str, size: int = 0) -> None:
        super().reading(what, size)
        if what.startswith("putting "):
            self.syncer.abandoned = "the job's end is near"


def test_an_abandon_after_the_last_chunk_puts_nothing_in_place(dirs, weights):
    """Before: only a chunk checked `abandoned`; an abandon after the last one let the left-behind thread rename
    the copy, repoint LATEST and prune, while state.json said the remote kept the older step."""
    local, remote = dirs
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED).sync_newest()
    save(local, 20, weights)
    syncer = Syncer(local, str(remote), EXPECTED)
    syncer.watch = watch = PuttingWatch()
    watch.syncer = syncer
    with pytest.raises(SyncAbandoned, match="abandoned: the job's end is near"):
        syncer.sync_newest()
    assert sorted(p.name for p in remote.iterdir() if not p.name.startswith(".")) == ["LATEST", "step-00000010"]
    assert not [p for p in remote.iterdir() if p.name.startswith(".tmp-")], list(remote.iterdir())
    assert checkpoint_dirs.read_latest(remote) == "step-00000010"


def test_an_abandon_during_the_lora_base_copy_stops_the_sync(dirs, weights, monkeypatch):
    """Before: basecopy.push_or_say took the SyncAbandoned for a base problem and the sync went on to copy."""
    from minilmd.daemon.jobs import basecopy

    local, remote = dirs
    save(local, 10, weights)
    base = local.parent / "init"
    base.mkdir()
    (base / basecopy.INIT_RECORD).write_text("{}")
    syncer = Syncer(local, str(remote), EXPECTED, base=base)

    def abandoned_midway(*args, **kwargs):
        syncer.abandoned = "the job's end is near"
        syncer._moved(1)  # the base copy's next chunk
        raise AssertionError("not reached")

    monkeypatch.setattr(basecopy, "push_found", abandoned_midway)
    with pytest.raises(SyncAbandoned):
        syncer.sync_newest()
    assert syncer.base_problem is None, syncer.base_problem  # not taken for a base the remote lacks
    assert not checkpoint_dirs.list_checkpoints(remote)


def test_an_abandon_waits_for_a_repoint_of_latest_under_way_and_returns_its_step(dirs):
    """A Slurm job's cut gave up on a sync already past its last check, renaming LATEST on a slow remote: the cut
    said `run.remote keeps step 10` while LATEST came to name step 40 (a real-Slurm test, flaky under load). Now
    the repoint holds Syncer.placing, an abandon waits for it and learns the step it put in place."""
    local, remote = dirs
    syncer = Syncer(local, str(remote), EXPECTED)
    syncer.placing.acquire()  # a repoint under way
    got: list[str] = []
    cutter = threading.Thread(target=lambda: got.append(syncer.abandon("the job's end is near", wait_s=600)))
    cutter.start()
    syncer.latest_placed = "step-00000040"  # ... that puts step 40 in place
    assert not syncer.abandoned and cutter.is_alive()  # it waits: no abandon lands inside a repoint
    syncer.placing.release()
    cutter.join(600)
    assert got == ["step-00000040"] and syncer.abandoned == "the job's end is near"
    with pytest.raises(SyncAbandoned):
        syncer._go_on()  # nothing more is put in place


def test_a_cut_names_the_step_a_repoint_put_in_place_before_the_abandon(tmp_path):
    line = f"JobState=RUNNING Reason=None Restarts=0 EndTime={iso(T0 + 100)}"
    job = slurm.SlurmJob(slurm.Allocation("42", ["node01"], []), {}, Events(), FakeScontrol(line),
                         signal_runner=FakeScontrol(line), environ={})
    job.preempt("USR1")
    job.preempted_at = T0
    answered(job)
    with last_sync_running(tmp_path) as (sync, syncer, said):
        syncer.abandon = lambda why: "step-00000004"  # a Syncer whose repoint of LATEST ended during the wait
        sync.state.remote_checkpoint = None
        words = lastsynccut.due(job, sync, sync.cfg, sync.state, lambda kind, m, **d: said.append(m),
                                Clock(T0 + 100 - jobend.REQUEUE_MARGIN_S)) or ""
        assert words.startswith("last sync cut at the job's end: run.remote keeps step 4, the newest"), words
        assert sync.state.remote_checkpoint is not None and sync.state.remote_checkpoint.step == 4
