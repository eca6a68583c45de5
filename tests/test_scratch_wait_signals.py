"""The launch's wait for room for scratch records its signals as the supervisor does (daemon/host/signals.py) and acts
on them as the supervisor would (review10a findings 1 and 2, docs10a False 2): before, it caught SIGTERM and SIGINT
only, so Slurm's `--signal=B:USR1@300` warning or a SIGHUP (logrotate, a tmux pane closing) killed the launch
(exit 138, state.json left `waiting_scratch`, no outcome, no requeue), and in a Slurm job Slurm's SIGTERM ended the
wait as a user's stop (exit 0, not requeued). Real `minilmd run` processes waiting for the inodes of a real full
tmpfs (skipped where mounting is refused), real signals; the Slurm job is its environment (SLURM_JOB_ID) and a fake
`scontrol` on PATH that records its calls.
"""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import load_state
from slurm_helpers import fake_scontrol
from supervisor_helpers import start_supervisor, wait_or_kill, write_config
from tmpfs_helpers import base, fill_inodes, wait_for_words  # noqa: F401 - base: the tmpfs fixture

JOB = "4242"


def waiting_run(base: Path, tmp_path: Path, corpus, **env):
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""})
    fill_inodes(base)
    log = tmp_path / "run.out"
    proc = start_supervisor(config, log, **env)
    wait_for_words(log, "waits:", proc)
    return proc, log, tmp_path / "s" / "run"


def test_sighup_and_sigusr1_outside_slurm_do_not_end_the_wait(base, tmp_path, corpus):
    """SIGHUP (supervisor.log reopened, after logrotate moved it) and SIGUSR1 outside a Slurm job (the supervisor
    ignores it) are said and let be: the wait goes on, state.json still says waiting_scratch, and a SIGTERM then
    ends it as a stop; its transitions are in events.jsonl and supervisor.log as the supervisor's are. Before:
    either signal killed the launch by its default action (exit -1 / 138), state.json left `waiting_scratch`, and
    nothing of the wait was logged."""
    proc, log, run_dir = waiting_run(base, tmp_path, corpus)
    try:
        (run_dir / names.SUPERVISOR_LOG).rename(run_dir / "supervisor.log.1")  # logrotate, then its HUP
        proc.send_signal(signal.SIGHUP)
        wait_for_words(log, "SIGHUP while waiting for room for scratch: supervisor.log reopened", proc)
        proc.send_signal(signal.SIGUSR1)
        wait_for_words(log, "SIGUSR1 ignored while waiting for room for scratch", proc)
        assert proc.poll() is None, log.read_text()
        assert load_state(run_dir)["phase"] == "waiting_scratch"
        proc.send_signal(signal.SIGTERM)
        assert wait_or_kill(proc, 120) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    after = load_state(run_dir)
    assert (after["phase"], after["outcome"]["ended"]) == ("done", "stopped"), after
    # the wait's transitions are logged as the supervisor's are, the end in the reopened supervisor.log
    events = [json.loads(line) for line in (run_dir / names.EVENTS).read_text().splitlines()]
    assert [e["event"] for e in events] == ["waiting_scratch", "signal", "stopped_waiting"], events
    assert (events[-1]["old"], events[-1]["new"], events[-1]["exit"]) == ("waiting_scratch", "done", 0), events
    assert "[stopped_waiting] waiting_scratch -> done" in (run_dir / names.SUPERVISOR_LOG).read_text()
    assert "[waiting_scratch] the launch waits" in (run_dir / "supervisor.log.1").read_text()


@pytest.fixture
def slurm_job(tmp_path) -> tuple[dict, Path]:
    """A Slurm job's environment, its `scontrol` a fake on PATH that records each call and says the job runs."""
    return fake_scontrol(tmp_path, JOB)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2], ids=["USR1", "TERM", "USR2"])
def test_a_slurm_preemption_during_the_wait_requeues_the_job_as_the_supervisor_does(base, tmp_path, corpus,
                                                                                    slurm_job, sig):
    """In a Slurm job the time-limit warning (USR1) or Slurm's SIGTERM during the wait is a preemption, as in the
    supervisor (daemon/slurm/job.py on_signal, SlurmJob.plan): nothing to save, the job is requeued at once
    (`scontrol requeue JOB`), state.json `done` (requeued), exit 0. Before: USR1 killed the launch (exit 138,
    state.json waiting_scratch); a SIGTERM ended it as a user's stop, not requeued. A SIGUSR2 with no `minilmd stop`
    request in run.dir is Slurm's warning too (`--signal=B:USR2@300`: stoprequest.asked_now); before, it ended the
    wait as `minilmd stop`'s, not requeued."""
    env, calls = slurm_job
    proc, log, run_dir = waiting_run(base, tmp_path, corpus, **env)
    try:
        proc.send_signal(sig)
        assert wait_or_kill(proc, 120) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    after = load_state(run_dir)
    assert (after["phase"], after["outcome"]["ended"], after["outcome"]["exit"]) == ("done", "requeued", 0), after
    assert f"requeue {JOB}" in calls.read_text().splitlines(), calls.read_text()
    assert "nothing started" in after["outcome"]["reason"], after
    # the slurm section a preempted supervisor writes (SlurmJob, its one writer): before, none at all
    slurm = dict(after.get("slurm") or {})
    assert isinstance(slurm.pop("nodes", None), list), after  # this host, as the job's allocation reads it
    assert slurm == {"job_id": JOB, "gpus": [], "restart_count": 0, "state": "REQUEUED", "preempted_at_step": None,
                     "requeued": True}, after


def test_a_failed_requeue_during_the_wait_says_so_in_the_slurm_section(base, tmp_path, corpus, slurm_job):
    """`scontrol requeue` failing during the wait: exit 1, state.json's slurm section says the job was not
    requeued and still runs, as a supervisor's failed requeue does (SlurmJob.requeue)."""
    env, calls = slurm_job
    fake = Path(env["PATH"].split(":")[0]) / "scontrol"
    fake.write_text(fake.read_text().replace("exit 0\n", 'case "$*" in requeue*) echo denied >&2; exit 1;; esac\n'
                                                          "exit 0\n"))
    proc, log, run_dir = waiting_run(base, tmp_path, corpus, **env)
    try:
        proc.send_signal(signal.SIGUSR1)
        assert wait_or_kill(proc, 120) == 1, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    after = load_state(run_dir)
    assert f"requeue {JOB}" in calls.read_text().splitlines(), calls.read_text()
    assert (after["phase"], after["outcome"]["ended"], after["outcome"]["exit"]) == ("done", "requeued", 1), after
    assert "scontrol requeue 4242 failed" in after["outcome"]["reason"], after
    assert (after["slurm"]["job_id"], after["slurm"]["requeued"], after["slurm"]["state"]) == (JOB, False,
                                                                                             "RUNNING"), after
