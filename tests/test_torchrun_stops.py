"""A stop of a torchrun group with two real gloo ranks (CPU), launched as the supervisor launches an attempt
(daemon/child/process.py launch: its own session, output to the attempt log), through the one torchrun launcher,
trainer/loop/torchrun.py (review9c #3 and #7).

- A stop whose save rank 0 writes for longer than torchrun's grace: torchrun stops the ranks still running as soon
  as one exits nonzero (SIGTERM, then SIGKILL 30 s later, a grace no option changes). Before, rank 1 exited 75 at
  once, and rank 0, still writing, was SIGKILLed: exit codes {75, -9}, torchrun's exit 1, the save lost. Now every
  rank waits at a barrier until rank 0's write is on disk (Saves.exit_barrier): both exit 75, and so does the job.
- SIGTERM to torchrun itself (the supervisor's stop, to the trainer's process group): torch's agent passes it to the
  ranks, which save and exit 75, and then raises SignalException, which made torchrun's exit 1 whatever the ranks
  said. Now the launcher exits with the status they all gave.
"""
from __future__ import annotations

import os
import signal
import sys

import pytest

from minilmd import names, protocol
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.config import load_config
from minilmd.daemon.base.runstate import read_heartbeat
from minilmd.daemon.base.states import Cause
from minilmd.daemon.child.process import classify, launch
from trainer_corpus import write_config
from waiting import wait_until

SLOW_SAVE_S = 45
"""Rank 0's stop save, slowed past torchrun's 30 s grace between its SIGTERM and its SIGKILL."""

RANKS = """
import atexit, os, sys, time
from pathlib import Path
rank = os.environ["RANK"]
Path(os.environ["RANK_PIDS"], "rank" + rank).write_text(str(os.getpid()))
if rank == "0" and os.environ.get("SLOW_SAVE_S"):
    from minilmd.trainer.checkpoint import save
    write = save.AsyncCheckpointer._write
    def slow_write(self, step, *args):
        time.sleep(float(os.environ["SLOW_SAVE_S"]))
        write(self, step, *args)
        print(f"rank 0: step {step} written", flush=True)
    save.AsyncCheckpointer._write = slow_write
atexit.register(lambda: print(f"rank {rank}: exiting", flush=True))
from minilmd.cli import main
sys.argv[0] = "minilmd"
main()
"""
"""`python -m minilmd.cli` for each rank, its pid in RANK_PIDS/rankN; with SLOW_SAVE_S, rank 0's checkpoint writes
(the background thread's) take that much longer, and say when they are done; every rank says when it exits."""


def _start(tmp_path, corpus, extra: dict):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = write_config(tmp_path, corpus, run={"dir": str(run_dir)},
                          train={"max_steps": 100000, "checkpoint_every": 100000, "micro_batch_size": 2})
    wrapper = tmp_path / "ranks.py"
    wrapper.write_text(RANKS)
    pids = tmp_path / "pids"
    pids.mkdir()
    command = [sys.executable, "-m", names.TORCHRUN_LAUNCHER, "--standalone", "--nproc_per_node", "2",
               "--max-restarts", "0", str(wrapper), "train", str(config)]
    child = launch(command, run_dir, 1, devices="", extra_env={"RANK_PIDS": str(pids), **extra})
    return child, run_dir, load_config(config), pids


def _step(run_dir) -> int:
    beat = read_heartbeat(run_dir)
    return beat.step if beat is not None else 0


def _ended(child, stop) -> tuple[int, str]:
    try:
        wait_until(lambda: _step(child.run_dir) >= 2, 300, "the two ranks at step 2")
        stop()
        rc = child.popen.wait(300)
    finally:
        if child.popen.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.kill_rest()
    return rc, child.log_path.read_text(errors="replace")


@pytest.mark.slow  # rank 0's save alone takes SLOW_SAVE_S
def test_no_rank_exits_before_rank_0s_stop_save_is_written_however_long_it_takes(tmp_path, corpus):
    child, run_dir, cfg, pids = _start(tmp_path, corpus, {"SLOW_SAVE_S": str(SLOW_SAVE_S)})
    rc, log = _ended(child, lambda: os.kill(int((pids / "rank1").read_text()), signal.SIGTERM))  # as Slurm's
    assert rc == protocol.EXIT_STOPPED, log[-4000:]
    steps = local_checkpoint_steps(cfg.checkpoint_dir)
    assert len(steps) == 1, (steps, log[-4000:])
    written = log.index(f"rank 0: step {steps[0]} written")
    assert log.index("rank 1: exiting") > written and log.index("rank 0: exiting") > written, log[-4000:]
    assert "SIGKILL" not in log, log[-4000:]


@pytest.mark.slow  # two ranks to start: ~20 s
def test_sigterm_to_torchrun_itself_ends_the_job_with_the_ranks_75(tmp_path, corpus):
    child, run_dir, cfg, _ = _start(tmp_path, corpus, {})
    rc, log = _ended(child, lambda: child.signal_group(signal.SIGTERM))  # as the supervisor stops a trainer
    assert rc == protocol.EXIT_STOPPED, log[-4000:]
    assert "torchrun: stopped by SIGTERM; every rank exited 75: exit status 75" in log, log[-4000:]
    assert classify(child, rc, run_dir, stop_requested=True).cause == Cause.STOPPED
    assert len(local_checkpoint_steps(cfg.checkpoint_dir)) == 1, log[-4000:]
