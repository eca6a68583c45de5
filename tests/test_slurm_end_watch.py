"""A preempted job's end is asked of Slurm in the background and moves when scontrol answers late
(daemon/slurm/endwatch.py, daemon/slurm/jobend.py).

Before: the end was asked once at the signal, the loop waiting up to SIGNAL_TIMEOUT_S, and a slurmctld that did not
answer then left the fallback for good: 300 s after a USR1, 30 s after a SIGTERM. A SIGTERM preemption with a
longer grace had its save and last sync cut 10 s after the signal, and the requeued job resumed from the last
synced step. `scontrol` here is a script on PATH, silent (it sleeps past the runner's bound) until the test lets it
answer, or a runner the test holds. The deadline is judged against a fake clock; nothing is timed. The runner
records each call before it runs it, and bounds a call the fake answers at BOUND_S, so that a loaded machine slows
the test, never fails it.
"""
from __future__ import annotations

import os
import stat
import subprocess
import threading
import time
from types import SimpleNamespace

from minilmd.daemon.host.signals import Signals
from minilmd.daemon.slurm import endwatch, jobend, lastsynccut
from minilmd.daemon.slurm import job as slurm
from waiting import wait_until, without_blocking

SCONTROL = """#!/bin/sh
# a slurmctld that does not answer until $FAKE_GO exists: silent ($FAKE_DOWN empty: sleeps past the runner's
# bound) or down (scontrol's own error, at once); `show config` answers KillWait at once if $FAKE_KILL_WAIT is set
# (tests/test_slurm_end_watch.py answers() says the same)
not_yet() {
  [ -z "$FAKE_DOWN" ] || { echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1; }
  exec sleep 60
}
case "$1 $2" in
  "show job") [ -e "$FAKE_GO" ] || not_yet
              echo "JobId=$4 JobState=RUNNING Reason=None Restarts=0 EndTime=$FAKE_END" ;;
  "show config") [ -n "$FAKE_KILL_WAIT" ] || [ -e "$FAKE_GO" ] || not_yet
                 echo "Configuration data as of 2026-12-06T04:00:00"
                 echo "KillWait                = ${FAKE_KILL_WAIT:-30} sec" ;;
esac
"""
BOUND_S = 10.0
"""Each scontrol call's bound where one must answer (SIGNAL_TIMEOUT_S's stand-in, generous for a loaded machine)."""
SILENT_BOUND_S = 0.5
"""The bound of a call the fake does not answer (answers()): what a silent call costs."""


class Events(list):
    def __call__(self, kind, message, **details):
        self.append(message)


def fake_slurm(tmp_path, monkeypatch, end: float = 0.0, kill_wait: str = "", down: bool = False) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GO", str(tmp_path / "go"))
    monkeypatch.setenv("FAKE_END", str(int(end)))
    monkeypatch.setenv("FAKE_KILL_WAIT", kill_wait)
    monkeypatch.setenv("FAKE_DOWN", "1" if down else "")


def answers(args: list[str], tmp_path) -> bool:
    """Whether the fake scontrol answers this call now (SCONTROL's rule), rather than stay silent or fail."""
    return (tmp_path / "go").exists() or (args[1:3] == ["show", "config"] and bool(os.environ["FAKE_KILL_WAIT"]))


def preempted_job(signal_name: str, events: Events, tmp_path, silent_bound: float = BOUND_S,
                  **kwargs) -> slurm.SlurmJob:
    """A SlurmJob preempted by `signal_name`: each scontrol call recorded in tmp_path/calls, then run, bounded at
    BOUND_S when the fake answers it, else at `silent_bound`."""
    def runner(args: list[str]) -> str:
        with open(tmp_path / "calls", "a", encoding="utf-8") as f:
            f.write(" ".join(args[1:]) + "\n")
        return slurm.run_command(args, BOUND_S if answers(args, tmp_path) else silent_bound)

    job = slurm.SlurmJob(slurm.Allocation("42", ["node01"], []), {}, events, lambda args: "",
                         signal_runner=runner, environ={}, **kwargs)
    assert job.preempt(signal_name)
    return job


def calls(tmp_path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_a_late_answer_moves_a_sigterms_deadline_later_and_the_save_is_not_cut_early(tmp_path, monkeypatch):
    """A SIGTERM preemption with a 120 s grace; `scontrol show job` silent at the signal (its silence costs
    SILENT_BOUND_S), answering at a later try."""
    end = time.time() + 120
    fake_slurm(tmp_path, monkeypatch, end, kill_wait="30")
    said = Events()
    job = preempted_job("SIGTERM", said, tmp_path, SILENT_BOUND_S)
    at = job.preempted_at
    cfg = SimpleNamespace(run_dir=tmp_path)  # no stop request in it: Slurm's SIGTERM
    # the first try is not answered: the fallback, KillWait's 30 s, and its deadline 10 s after the signal
    wait_until(lambda: (job.job_end(), said)[1], 60, "the end said after scontrol's silence")
    guess = job.job_end()
    assert guess.guessed and guess.at == at + jobend.KILL_WAIT_S, guess
    assert "did not answer: asked again in the background" in said[0], said
    assert lastsynccut.reached(job, cfg, lambda: at + 15)  # the fallback alone would cut the save now
    (tmp_path / "go").touch()
    answered = wait_until(lambda: job.job_end().at == int(end) and job.job_end(), 60, "the end moved to the answer")
    assert answered.source == "scontrol's EndTime" and not answered.guessed
    assert not lastsynccut.reached(job, cfg, lambda: at + 15)  # the save and the last sync go on
    assert lastsynccut.reached(job, cfg, lambda: int(end) - jobend.REQUEUE_MARGIN_S)  # until the answer's deadline
    moved = [m for m in said if m.startswith("the job's end moved from")]
    assert len(moved) == 1 and f"to {jobend.clock(int(end))}: Slurm answered" in moved[0], said
    job.job_end()
    assert len(said) == 2, said  # said once


def test_a_late_answer_moves_a_usr1s_deadline_earlier(tmp_path, monkeypatch):
    """A grace shorter than the warning's lead: the 300 s fallback would let the save run past Slurm's kill.
    slurmctld down at the signal (scontrol's error), up at a later try."""
    end = time.time() + 60
    fake_slurm(tmp_path, monkeypatch, end, down=True)
    said = Events()
    job = preempted_job("USR1", said, tmp_path)
    cfg = SimpleNamespace(run_dir=tmp_path)
    wait_until(lambda: (job.job_end(), said)[1], 60, "the end said after scontrol's silence")
    assert not lastsynccut.reached(job, cfg, lambda: int(end) - 10)  # the warning's 300 s: not yet
    (tmp_path / "go").touch()
    wait_until(lambda: job.job_end().at == int(end), 60, "the end moved to the answer")
    assert lastsynccut.reached(job, cfg, lambda: int(end) - 10)
    assert [m for m in said if m.startswith(f"the job's end moved from {jobend.clock(job.preempted_at + 300)} to ")]


def test_a_slurmctld_that_never_answers_is_asked_a_bounded_number_of_times_and_the_fallback_kept(tmp_path,
                                                                                                   monkeypatch):
    fake_slurm(tmp_path, monkeypatch)
    said = Events()
    job = preempted_job("SIGTERM", said, tmp_path, SILENT_BOUND_S, end_retry_s=(0.1,))
    watch = job.end_watch
    assert watch is not None
    wait_until(lambda: watch.settled, 60, "the tries spent")
    assert calls(tmp_path) == ["show job -o 42", "show config"] * 2, calls(tmp_path)
    end = job.job_end()
    assert end.guessed and end.at == job.preempted_at + jobend.KILL_WAIT_S and "default KillWait" in end.source
    assert lastsynccut.reached(job, SimpleNamespace(run_dir=tmp_path), lambda: job.preempted_at + 15)
    assert len(said) == 1 and "did not answer: its tries are spent" in said[0], said


def test_a_sigterms_fallback_is_the_clusters_killwait_when_only_the_config_answers(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch, kill_wait="120", down=True)
    job = preempted_job("SIGTERM", Events(), tmp_path, end_retry_s=(0.1,))
    wait_until(lambda: job.end_watch is not None and job.end_watch.settled, 60, "the tries spent")
    end = job.job_end()
    assert end.guessed and end.at == job.preempted_at + 120 and "scontrol show config" in end.source, end
    assert calls(tmp_path) == ["show job -o 42", "show config", "show job -o 42"], calls(tmp_path)


def test_killwait_is_read_from_the_config_and_bounds_a_sigterm_at_the_time_limit():
    config = "Configuration data as of 2026-12-06T04:00:00\nKillTimeout = 0\nKillWait                = 45 sec\n"
    assert jobend.kill_wait(config) == 45 and jobend.kill_wait("KillWait = 99999 sec") is None
    assert jobend.kill_wait("") is None
    t0 = 1_800_000_000.0
    reached = jobend.read({}, {"EndTime": str(int(t0 - 1))}, "SIGTERM", t0, 45)
    assert reached.at == t0 + 45 and "KillWait (scontrol show config) 45s" in reached.source, reached
    assert jobend.read({}, {}, "USR1", t0, 45).at == t0 + jobend.WARNING_S  # a USR1's lead is the warning's


def test_the_loop_is_not_held_while_scontrol_is_silent():
    """Before: preempt() waited for `scontrol show job` (up to SIGNAL_TIMEOUT_S) on the supervisor's loop."""
    asked, answer = threading.Event(), threading.Event()
    line = f"JobState=RUNNING Reason=None Restarts=0 EndTime={int(time.time()) + 500}"

    def held(args: list[str]) -> str:
        asked.set()
        answer.wait(120)
        return f"JobId=42 {line}\n"

    job = slurm.SlurmJob(slurm.Allocation("42", ["node01"], []), {}, Events(), lambda args: "",
                         signal_runner=held, environ={})
    assert without_blocking(lambda: job.preempt("USR1"), bound=60)
    assert asked.wait(60) and job.end_watch is not None and not job.end_watch.settled
    assert job.job_end().guessed  # the warning's lead meanwhile
    answer.set()
    wait_until(lambda: not job.job_end().guessed, 60, "the answer taken")


def test_the_loop_says_the_end_once_slurm_answers_with_no_cut_in_view():
    """The end is said from the loop's signal handling (on_signal, each tick after the preemption), not only where a
    cut is weighed: as the old ask at the signal did. A guard of the move to the background, not a fix."""
    line = f"JobState=RUNNING Reason=None Restarts=0 EndTime={int(time.time()) + 500}"
    said = Events()  # the supervisor's one event log: the job's and the loop's
    job = slurm.SlurmJob(slurm.Allocation("42", ["node01"], []), {}, said, lambda args: "",
                         signal_runner=lambda args: f"JobId=42 {line}\n" if args[1:3] == ["show", "job"] else "",
                         environ={})
    signals = Signals(usr1=True)
    slurm.on_signal(job, signals, said)  # the warning: the preemption
    assert job.preempted_by == "USR1" and signals.stop == 1
    ends = wait_until(lambda: (slurm.on_signal(job, signals, said), [m for m in said if "the job ends at" in m])[1],
                      60, "the job's end said")
    assert len(ends) == 1 and "(scontrol's EndTime)" in ends[0], said


def test_a_sigterms_endtime_is_used_while_killwait_is_still_asked():
    """`scontrol show job` answers at once, `scontrol show config` is held: the EndTime is the end meanwhile.
    Before: it was stored only once KillWait came too (up to SIGNAL_TIMEOUT_S later), the fallback kept until then."""
    end = int(time.time()) + 500
    config_asked, answer = threading.Event(), threading.Event()

    def runner(args: list[str]) -> str:
        if args[1:3] == ["show", "job"]:
            return f"JobId=42 JobState=RUNNING Reason=None Restarts=0 EndTime={end}\n"
        config_asked.set()
        answer.wait(120)
        return "KillWait                = 45 sec\n"

    said = Events()
    job = slurm.SlurmJob(slurm.Allocation("42", ["node01"], []), {}, said, lambda args: "", signal_runner=runner,
                         environ={})
    assert job.preempt("SIGTERM") and job.end_watch is not None
    try:
        assert config_asked.wait(60)
        taken = wait_until(lambda: job.job_end().at == end and job.job_end(), 60, "the EndTime taken")
        assert taken.source == "scontrol's EndTime" and not job.end_watch.settled
    finally:
        answer.set()
    wait_until(lambda: job.end_watch.settled, 60, "KillWait answered")
    assert job.job_end().at == end and len(said) == 1 and "(scontrol's EndTime)" in said[0], said


def test_the_same_end_known_another_way_is_not_said_to_have_moved():
    """Try 1: the job silent, the config failing (the default KillWait, 30 s); try 2: the config answers 30 s, the
    same end read another way. Before: `the job's end moved from T to T`."""
    said, go, config_calls = Events(), threading.Event(), []

    def runner(args: list[str]) -> str:
        config_calls.append(args)
        if len(config_calls) == 1:
            raise subprocess.SubprocessError("scontrol show config: exit 1: slurm_load_ctl_conf error")
        go.wait(120)
        return "KillWait                = 30 sec\n"

    watch = endwatch.EndWatch(lambda: {}, runner, {}, "SIGTERM", time.time(), said, delays=(0.0,))
    wait_until(lambda: (watch.current(), said)[1], 60, "the fallback said")
    assert len(said) == 1 and "Slurm's default KillWait" in said[0], said
    go.set()
    wait_until(lambda: watch.settled, 60, "the tries spent")
    end = watch.current()
    assert "30s after the SIGTERM, Slurm's KillWait (scontrol show config)" in end.source, end
    assert len(said) == 1, said
