"""Rank 0 of a torchrun group dies (SIGKILL) while another rank waits for it at the exit barrier
(trainer/loop/saving.py Saves.exit_barrier: every rank waits there until rank 0's last write is on disk), or before
that rank has reached it. Two real gloo ranks on CPU (tests/torchrun_ranks.py), the run's grace (the agent's wait
before its SIGKILL) set to 10 min, so that a rank stuck in the barrier would show as the launcher not ending.

The barrier is on the gloo control group: a rank 0 that died has closed its connections, so the other rank's
barrier ends with an error at once (or when it enters it) rather than waiting out the group's 30-minute timeout. It
then exits by itself (its atexit runs: no SIGKILL), the launcher exits 1 with the agent's report, the supervisor
reads a SIGKILLed rank (cause `killed`, restarted, never `done` or a hang), and the restart resumes from the newest
checkpoint on disk.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from minilmd import names, protocol
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.config import RestartSection
from minilmd.daemon.base.states import Action, Cause
from minilmd.daemon.child.death import classify
from minilmd.daemon.child.policy import decide
from torchrun_ranks import end, ended, log_says, start
from waiting import wait_until


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (not a zombie the agent has yet to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # two starts of two ranks: ~60 s
@pytest.mark.parametrize("when", ["in_the_barrier", "before_the_barrier"])
def test_rank_0_killed_while_another_rank_waits_at_the_exit_barrier_is_a_crash_restarted_from_the_last_checkpoint(
        tmp_path, corpus, when):
    hooks = {"SLOW_FINISH_S": "600", names.TORCHRUN_GRACE_ENV: "600"}
    if when == "before_the_barrier":
        hooks["HOLD_EXIT_BARRIER"] = "1"
    child, run_dir, cfg, pids = start(tmp_path, corpus, hooks, train={"checkpoint_every": 2})
    try:
        wait_until(lambda: local_checkpoint_steps(cfg.checkpoint_dir), 300, "a first checkpoint")
        os.kill(int((pids / "rank1").read_text()), signal.SIGTERM)  # a stop both ranks agree on, as Slurm's
        rank_1_waits = "rank 1: in the exit barrier" if when == "in_the_barrier" else "rank 1: held before the exit"
        wait_until(lambda: log_says(child, "rank 0: waiting for its last write") and log_says(child, rank_1_waits),
                   300, "rank 0 in its last write's wait, rank 1 at the exit barrier")
        rank0 = int((pids / "rank0").read_text())
        os.kill(rank0, signal.SIGKILL)
        if when == "before_the_barrier":
            wait_until(lambda: not _alive(rank0), 60, "rank 0 gone")
            (pids / "go").touch()  # rank 1 enters the barrier now, rank 0 dead
        try:
            rc = child.popen.wait(300)  # bounded: the agent itself would wait 600 s for a rank stuck there
        except Exception as e:
            raise AssertionError(f"the launcher did not end: rank 1 stuck in the exit barrier?\n"
                                 f"{child.log_path.read_text(errors='replace')[-4000:]}") from e
    finally:
        end(child)
    log = child.log_path.read_text(errors="replace")
    assert "rank 1: in the exit barrier" in log and "rank 1: exiting" in log, log[-4000:]  # ended by itself
    assert "rank 0: exiting" not in log and rc == 1, log[-4000:]
    death = classify(child, rc, run_dir, stop_requested=False)
    assert death.cause == Cause.KILLED, (death, log[-4000:])
    decision = decide(death, restart=RestartSection(), restarts_so_far=0, no_progress_streak=0, stop_requested=False,
                      micro_batch_size=2, grad_accum=1)
    assert decision.action == Action.RESTART, decision
    good = max(local_checkpoint_steps(cfg.checkpoint_dir))

    again, _, _, _ = start(tmp_path, corpus, {}, attempt=2, train={"checkpoint_every": 2})
    rc, log = ended(again, lambda: again.signal_group(signal.SIGTERM))
    assert f"at step {good}" in log.split("minilmd: resumed from", 1)[1].splitlines()[0], log[-4000:]
    assert rc == protocol.EXIT_STOPPED, log[-4000:]
