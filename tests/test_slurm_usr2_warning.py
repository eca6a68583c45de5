"""A Slurm job whose script asks its warning as SIGUSR2 (`#SBATCH --signal=B:USR2@300`, a user who picked USR2):
the warning is a preemption, as USR1's, and the job is requeued; `minilmd stop`'s SIGUSR2, which comes after its
stop request (daemon/base/stoprequest.py asked_now), still stops the run for good. Before, every SIGUSR2 was taken as
`minilmd stop`'s: the unattended job ended "stopped on request" at its warning, never requeued, and its run stayed
unfinished. A real supervisor and the fake trainer in a fake Slurm job (its scontrol a fake on PATH that records the
requeue: tests/slurm_helpers.py), real signals.
"""
from __future__ import annotations

import signal
import time

import pytest

from minilmd.config import load_config
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
