"""run.dir full under torchrun with two real gloo ranks (CPU), launched as the supervisor launches an attempt
(daemon/child/process.py launch: its own session, output to the attempt log), run.dir's disk a real small tmpfs.

Observed before: the rank whose write found run.dir full saved and exited 73, the other rank, stopped by the
agreement (guards.agree), exited 75; torchrun exits 1 whenever a rank fails, so the supervisor read a crash
("exit 1") and never the run.dir-full stop. Now any rank's full run.dir is every rank's (StopFlag.agreed): both
exit 73 after the save, and torchrun's wrapper (trainer/loop/torchrun.py) passes that status on: the whole job
exits 73 and the supervisor classifies it RUN_DIR_FULL (its wait for room: tests/test_rundir_full_restart.py).

Two ways in: rank 1 alone meets the full disk (its log output, the only thing a rank other than 0 writes there:
here rank 1's stdout and stderr alone go to a file on the tmpfs, so rank 0 never meets it), and rank 0 meets it
(heartbeat, metrics: run.dir and the attempt log both on the tmpfs) while rank 1 is mid-step.
"""
from __future__ import annotations

import os
import signal
import sys

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from filling import fill
from minilmd import names, protocol
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.config import load_config
from minilmd.daemon.base.runstate import read_heartbeat
from minilmd.daemon.base.states import Cause
from minilmd.daemon.child.death import classify
from minilmd.daemon.child.process import is_torchrun, launch
from minilmd.trainer.loop.torchrun import ranks_status, shared_status
from trainer_corpus import write_config
from waiting import wait_until

RANK_ONE_WRITES = """
import os, sys, threading, time
from pathlib import Path
if os.environ["RANK"] == "1" and os.environ.get("RANK1_LOG"):
    fd = os.open(os.environ["RANK1_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    go = Path(os.environ["RANK1_GO"])
    def write_when_told():  # a long line of rank 1's log, once its disk is full: more than its last page holds
        while not go.exists():
            time.sleep(0.05)
        print("rank 1: " + "x" * 16384, flush=True)
    threading.Thread(target=write_when_told, daemon=True).start()
from minilmd.cli import main
sys.argv[0] = "minilmd"
main()
"""
"""`python -m minilmd.cli` for each rank; rank 1's output to RANK1_LOG, one line there once RANK1_GO exists (16 KiB:
a short one fits in the tmpfs page the log already has, and a full disk refuses only a new page)."""


@pytest.mark.slow
@pytest.mark.parametrize("who", ["rank1", "rank0"])
def test_a_full_run_dir_met_by_either_rank_ends_the_torchrun_job_with_73_after_the_save(tmp_path, corpus,
                                                                                      small_tmpfs, who):
    disk = small_tmpfs("4m")
    run_dir = (disk if who == "rank0" else tmp_path) / "run"
    run_dir.mkdir()
    config = write_config(tmp_path, corpus, run={"dir": str(run_dir)},
                          train={"max_steps": 100000, "checkpoint_every": 100000, "micro_batch_size": 2})
    cfg = load_config(config)
    wrapper = tmp_path / "ranks.py"
    wrapper.write_text(RANK_ONE_WRITES)
    go = tmp_path / "go"
    extra = {"RANK1_LOG": str(disk / "rank1.log"), "RANK1_GO": str(go)} if who == "rank1" else {}
    command = [sys.executable, "-m", names.TORCHRUN_LAUNCHER, "--standalone", "--nproc_per_node", "2",
               "--max-restarts", "0", str(wrapper), "train", str(config)]
    assert is_torchrun(command)
    child = launch(command, run_dir, 1, devices="", extra_env=extra)
    try:
        wait_until(lambda: _step(run_dir) >= 3, 300, "the two ranks at step 3")
        at_fill = _step(run_dir)
        fill(disk)
        go.touch()
        rc = child.popen.wait(300)
    finally:
        if child.popen.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.kill_rest()
    log = child.log_path.read_text(errors="replace")
    assert rc == protocol.EXIT_RUN_DIR_FULL, log[-4000:]
    assert classify(child, rc, run_dir, stop_requested=False).cause == Cause.RUN_DIR_FULL
    steps = local_checkpoint_steps(cfg.checkpoint_dir)
    assert len(steps) == 1 and steps[0] >= at_fill, (steps, at_fill, log[-4000:])  # the stop's save, in scratch
    if who == "rank1":  # rank 0's log (run.dir has room) says why it stopped: rank 1's write
        assert f"run.dir is full (another rank's write there found no room); saving at step {steps[0]}" in log, \
            log[-4000:]


def _step(run_dir) -> int:
    beat = read_heartbeat(run_dir)
    return beat.step if beat is not None else 0


@pytest.mark.parametrize("exits,status", [
    ((73, 73), 73), ((73, -signal.SIGTERM), 73), ((-signal.SIGTERM, 75), 75),  # a SIGTERM: torchrun's stop of the rest
    # any status they share, as one trainer's exit with it: config or data refused (final), CUDA OOM, a failed flush
    ((2, 2), 2), ((65, -signal.SIGTERM), 65), ((-signal.SIGTERM, 76), 76), ((74, 74), 74), ((120,), 120),
    ((73, 1), None), ((73, 75), None), ((2, 65), None), ((76, 1), None), ((73, -signal.SIGKILL), None),
    ((-signal.SIGTERM,), None), ((1,), 1)])
def test_torchrun_passes_on_the_status_its_failed_ranks_share(exits, status):
    failures = {rank: ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="<N/A>")
                for rank, code in enumerate(exits)}
    assert ranks_status(ChildFailedError("train", failures)) == status


@pytest.mark.parametrize("ends,status", [
    ([75, 75], 75), ([73, 73], 73), ([2, 2], 2),
    # after torchrun's own stop signal every rank got SIGTERM: one that died of it, or of the SIGKILL at the end of
    # the agent's grace, did not save; one it abandoned still running (None) neither
    ([75, -signal.SIGTERM], None), ([75, -signal.SIGKILL], None), ([75, None], None), ([75, 73], None),
    ([0, 75], None), ([], None)])
def test_after_a_stop_signal_to_torchrun_its_status_is_the_one_every_rank_gave(ends, status):
    assert shared_status(ends) == status
