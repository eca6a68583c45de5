"""A Slurm job whose script asks its warning as SIGUSR2 (`#SBATCH --signal=B:USR2@300`, a user who picked USR2):
the warning is a preemption, as USR1's, and the job is requeued; `minilmd stop`'s SIGUSR2, which comes after its
stop request (daemon/base/stoprequest.py asked_now), still stops the run for good. Before, every SIGUSR2 was taken as
`minilmd stop`'s: the unattended job ended "stopped on request" at its warning, never requeued, and its run stayed
unfinished. A real supervisor and the fake trainer in a fake Slurm job (its scontrol a fake on PATH that records the
requeue: tests/slurm_helpers.py), real signals.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from minilmd import names, protocol
from minilmd.config import load_config
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.views.stop import _slurm_job_of
from slurm_helpers import job_line, slurm_env
from supervisor_helpers import cli, start_supervisor, state, wait_or_kill, write_config
from waiting import wait_until


@pytest.mark.slow  # a real supervisor and the fake trainer, until its first synced checkpoint
@pytest.mark.parametrize("by", ["slurm", "minilmd stop"])
def test_a_sigusr2_without_a_stop_request_in_a_slurm_job_is_its_warning_and_requeues_the_job(tmp_path, corpus, by):
    config = write_config(tmp_path, corpus, name="u2", train={"max_steps": 100_000, "checkpoint_every": 5})
    run_dir = load_config(config).run_dir
    env = slurm_env(tmp_path, 0)
    job_line(tmp_path, 0, time.time() + 3600)
    sup = start_supervisor(config, tmp_path / "sup.out", **env)
    try:
        wait_until(lambda: (state(run_dir).get("remote_checkpoint") or {}).get("step"), timeout=180,
                   what="a checkpoint synced to the remote")
        if by == "slurm":
            sup.send_signal(signal.SIGUSR2)  # what `--signal=B:USR2@300` sends the batch script's minilmd run
        else:
            stopped = cli("stop", str(run_dir), timeout=180)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert wait_or_kill(sup, 180) == 0, (tmp_path / "sup.out").read_text()[-3000:]
    finally:
        wait_or_kill(sup, 1) if sup.poll() is None else None
    left = state(run_dir)
    calls = tmp_path / "scontrol-calls"
    requeues = calls.read_text().splitlines().count("requeue 42") if calls.exists() else 0
    if by == "slurm":
        assert left["outcome"]["ended"] == "requeued" and requeues == 1, (left["reason"], requeues)
        assert "taken as its USR1" in (tmp_path / "sup.out").read_text()
    else:
        assert left["reason"].startswith("stopped on request (minilmd stop at "), left["reason"]
        assert left["outcome"]["ended"] == "stopped" and requeues == 0, (left["outcome"], requeues)


@pytest.mark.slow  # a real supervisor and the fake trainer, stopped twice
@pytest.mark.parametrize("in_slurm", [True, False], ids=["slurm job", "no slurm"])
def test_a_stop_whose_request_cannot_be_written_sends_a_slurm_job_no_signal_that_would_requeue_it(tmp_path, corpus,
                                                                                                  in_slurm):
    """`minilmd stop` that cannot write its request (run.dir full, root squashed on NFS; here a directory planted
    where the request goes, which no rename replaces): in a Slurm job its SIGUSR2 would be read as Slurm's warning
    (no request: stoprequest.asked_now), and the job saved, synced and requeued, training on. So stop sends none, and
    says why and what to do (`scancel`); with the request writable again, the same stop ends the job for good.
    Before, the SIGUSR2 went, and the job was requeued. Outside Slurm a SIGUSR2 is always a stop: sent, as before."""
    config = write_config(tmp_path, corpus, name="unw", train={"max_steps": 100_000, "checkpoint_every": 5})
    run_dir = load_config(config).run_dir
    env = slurm_env(tmp_path, 0) if in_slurm else {"FAKE_STEP_S": "0.05"}
    job_line(tmp_path, 0, time.time() + 3600)
    sup = start_supervisor(config, tmp_path / "sup.out", **env)
    try:
        wait_until(lambda: state(run_dir).get("phase") == "training", timeout=180, what="the trainer training")
        (run_dir / names.STOP_REQUEST).mkdir()
        (run_dir / names.STOP_REQUEST / "kept").write_text("a directory with something in it\n")
        stopped = cli("stop", str(run_dir), timeout=180)
        said = stopped.stdout + stopped.stderr
        assert "the stop request cannot be written" in said, said
        if in_slurm:
            assert stopped.returncode == protocol.STOP_FAILED, said
            assert "runs in Slurm job 42" in said and "not signalled" in said and "`scancel 42`" in said, said
            assert sup.poll() is None and state(run_dir)["phase"] == "training", state(run_dir).get("reason")
            shutil.rmtree(run_dir / names.STOP_REQUEST)  # writable again: the same stop ends the job for good
            stopped = cli("stop", str(run_dir), timeout=180)
        assert stopped.returncode == protocol.STOP_DONE, stopped.stdout + stopped.stderr
        assert wait_or_kill(sup, 180) == 0, (tmp_path / "sup.out").read_text()[-3000:]
    finally:
        wait_or_kill(sup, 1) if sup.poll() is None else None
    left = state(run_dir)
    calls = tmp_path / "scontrol-calls"
    assert not calls.exists(), calls.read_text()  # never requeued
    assert left["reason"].startswith("stopped on request"), left["reason"]
    assert left["outcome"]["ended"] == "stopped", left["outcome"]


def test_stop_tells_a_supervisor_in_a_slurm_job_by_its_environment_else_by_state_json(tmp_path):
    """What `stop` reads to know its signal would be taken as Slurm's warning: the supervisor's own environment (what
    it tells itself by: daemon/slurm/job.py detect), and only where that cannot be read (the process gone, /proc
    hidden) state.json's slurm section, when it names that process as its supervisor."""
    def job_of(pid: int, **state_json: object) -> str:
        return _slurm_job_of(pid, StateJson.from_dict(state_json))

    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    in_job = subprocess.Popen(sleep, env={**os.environ, names.SLURM_JOB_ENV: "7"})
    outside = subprocess.Popen(sleep, env={k: v for k, v in os.environ.items() if k != names.SLURM_JOB_ENV})
    try:
        assert job_of(in_job.pid) == "7"
        assert job_of(outside.pid, supervisor={"pid": outside.pid}, slurm={"job_id": "9"}) == ""  # its own word
    finally:
        for child in (in_job, outside):
            child.kill()
            child.wait()
    gone = outside.pid  # reaped: its environment cannot be read
    assert job_of(gone, supervisor={"pid": gone}, slurm={"job_id": "9"}) == "9"
    assert job_of(gone, supervisor={"pid": gone + 1}, slurm={"job_id": "9"}) == ""  # another supervisor's section
    assert job_of(gone, supervisor={"pid": gone}) == ""
