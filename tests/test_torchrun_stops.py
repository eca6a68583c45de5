"""A stop of a torchrun group with two real gloo ranks (CPU), launched as the supervisor launches an attempt
(daemon/child/process.py launch: its own session, output to the attempt log), through the one torchrun launcher,
trainer/loop/torchrun.py (review9c #3 and #7).

- A stop whose save rank 0 writes for longer than torchrun's grace: torchrun stops the ranks still running as soon
  as one exits nonzero (SIGTERM, then SIGKILL 30 s later, a grace no option changes; TORCH_WAIT_S here). Before,
  rank 1 exited 75 at once, and rank 0, still writing, was SIGKILLed: exit codes {75, -9}, torchrun's exit 1, the
  save lost. Now every rank waits at a barrier until rank 0's write is on disk (Saves.exit_barrier): both exit 75,
  and so does the job.
- SIGTERM to torchrun itself (the supervisor's stop, to the trainer's process group): torch's agent passes it to the
  ranks, which save and exit 75, and then raises SignalException, which made torchrun's exit 1 whatever the ranks
  said. Now the launcher exits with the status they all gave.
"""
from __future__ import annotations

import os
import signal

import pytest

from minilmd import protocol
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base.states import Cause
from minilmd.daemon.child.death import classify
from torchrun_ranks import ended, start

TORCH_WAIT_S, SLOW_SAVE_S = 5, 20
"""Torchrun's grace between its SIGTERM and its SIGKILL, torch's 30 s shortened (torchrun_ranks.LAUNCHER), and rank 0's
stop save, slowed 15 s past it (as 45 s was past the 30): a rank that exited at once would leave the save SIGKILLed."""


@pytest.mark.slow  # rank 0's save alone takes SLOW_SAVE_S
def test_no_rank_exits_before_rank_0s_stop_save_is_written_however_long_it_takes(tmp_path, corpus):
    child, run_dir, cfg, pids = start(tmp_path, corpus, {"SLOW_SAVE_S": str(SLOW_SAVE_S)}, torch_wait_s=TORCH_WAIT_S)
    rc, log = ended(child, lambda: os.kill(int((pids / "rank1").read_text()), signal.SIGTERM))  # as Slurm's
    assert rc == protocol.EXIT_STOPPED, log[-4000:]
    steps = local_checkpoint_steps(cfg.checkpoint_dir)
    assert len(steps) == 1, (steps, log[-4000:])
    written = log.index(f"rank 0: step {steps[0]} written")
    assert log.index("rank 1: exiting") > written and log.index("rank 0: exiting") > written, log[-4000:]
    assert "SIGKILL" not in log, log[-4000:]


@pytest.mark.slow  # two ranks to start: ~20 s
def test_sigterm_to_torchrun_itself_ends_the_job_with_the_ranks_75(tmp_path, corpus):
    child, run_dir, cfg, _ = start(tmp_path, corpus, {})
    rc, log = ended(child, lambda: child.signal_group(signal.SIGTERM))  # as the supervisor stops a trainer
    assert rc == protocol.EXIT_STOPPED, log[-4000:]
    assert "torchrun: stopped by SIGTERM; every rank exited 75: exit status 75" in log, log[-4000:]
    assert classify(child, rc, run_dir, stop_requested=True).cause == Cause.STOPPED
    assert len(local_checkpoint_steps(cfg.checkpoint_dir)) == 1, log[-4000:]
