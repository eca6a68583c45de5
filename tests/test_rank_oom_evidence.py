"""An OOM kill of a torchrun rank is an OOM kill (fault9 F4): the OOM killer takes a rank, not the agent the supervisor
started, and before only the agent's pid and memory cgroup were read, so a rank's OOM kill was called "SIGKILL from
outside, not by the OOM killer". Real processes and signals: a stand-in agent (its command names torch.distributed.run)
starts two ranks as torchrun does (children of the agent, sessions of their own, RANK in their environment) and, when
rank 0 dies of a signal, prints torchrun's failure summary and exits 1. The kernel log is a fake `dmesg` first on PATH;
the memory cgroups' counters are files of the test's."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from fake_kernel_log import NOW, fake_dmesg
from minilmd.daemon.child import process as childmod
from minilmd.daemon.child.death import classify
from minilmd.daemon.child.oomevidence import expected_ranks, ranks_among
from minilmd.daemon.child.process import launch

AGENT = """
import os, subprocess, sys, time
pids = sys.argv[1]
ranks = [subprocess.Popen([sys.executable, "-c", "import os, time\\n"
                           f"open({pids!r} + '/rank{i}.tmp', 'w').write(str(os.getpid()))\\n"
                           f"os.rename({pids!r} + '/rank{i}.tmp', {pids!r} + '/rank{i}')\\n"
                           "time.sleep(120)"],
                          env={**os.environ, "RANK": str(i), "LOCAL_RANK": str(i)}, start_new_session=True)
         for i in range(2)]
rc = ranks[0].wait()
ranks[1].terminate()
ranks[1].wait()
print("Root Cause (first observed failure):")
print("[0]:")
print("  rank      : 0 (local_rank: 0)")
print(f"  exitcode  : {rc} (pid: {ranks[0].pid})", flush=True)
sys.exit(1)
"""
"""What torchrun does, as far as the supervisor sees it: two workers, the first failure's summary, exit 1."""


NOT_YET_A_RANK = """
import os, subprocess, sys
env = {k: v for k, v in os.environ.items() if k != "RANK"}
subprocess.Popen([sys.executable, "-c", "import os, sys, time\\n"
                  f"open({sys.argv[1]!r} + '/norank.tmp', 'w').write(str(os.getpid()))\\n"
                  f"os.rename({sys.argv[1]!r} + '/norank.tmp', {sys.argv[1]!r} + '/norank')\\n"
                  "time.sleep(120)"], env=env, start_new_session=True)
""" + AGENT
"""The agent as above, with one more child first: one whose environment has no RANK, as a worker has between the
agent's fork and its exec (it shows the agent's environment then)."""


def launch_agent(tmp_path: Path, agent: str = AGENT):
    """The stand-in agent launched as the supervisor launches a trainer, and watched as its ticks watch it until
    both ranks are seen: (child, rank pids)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pids = tmp_path / "pids"
    pids.mkdir()
    command = [sys.executable, "-c", agent, str(pids), "torch.distributed.run", "--nproc_per_node", "2"]
    child = launch(command, run_dir, 1, devices="")
    deadline = time.monotonic() + 60
    while not all((pids / f"rank{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and child.poll() is None, "the stand-in agent never started its ranks"
        time.sleep(0.02)
    while len(child.ranks) < 2:  # the supervisor's ticks: the ranks are looked for every RANK_SCAN_S
        assert time.monotonic() < deadline, f"the ranks were never found: {child.ranks}"
        child.track_cgroup()
        time.sleep(0.05)
    return child, [int((pids / f"rank{i}").read_text()) for i in range(2)]


def kill_rank_and_classify(child, rank_pid: int):
    os.kill(rank_pid, signal.SIGKILL)  # the OOM killer's signal
    rc = child.popen.wait(60)
    child.kill_rest()  # nothing should be left; a failed assertion above must not leave a rank sleeping
    return rc, classify(child, rc, child.run_dir, stop_requested=False)


def test_a_kernel_log_record_of_a_ranks_pid_is_an_oom_kill_naming_the_rank(tmp_path, monkeypatch):
    fake_dmesg(tmp_path, monkeypatch, f"echo \"[{NOW}] Memory cgroup out of memory: Killed process "
                                      f"$(cat {tmp_path}/pids/rank0) (python) total-vm:1kB\"")
    child, (rank0, rank1) = launch_agent(tmp_path)
    assert sorted((r.pid, r.name) for r in child.ranks) == [(rank0, "rank 0"), (rank1, "rank 1")], child.ranks
    child.cgroup_oom = {}  # the host's cgroup layout is not this test's: only the kernel log speaks here
    rc, death = kill_rank_and_classify(child, rank0)
    assert rc == 1 and death.cause == "oom_kill", death
    assert death.detail == f"SIGKILL by the OOM killer (kernel log names pid {rank0}, torchrun rank 0)", death


def test_a_ranks_memory_cgroup_counter_that_rose_is_an_oom_kill_naming_the_rank(tmp_path, monkeypatch):
    """Each rank in a memory cgroup of its own (v1 memory.oom_control; v2 memory.events reads the same): rank 0's
    counter rises, the agent's stays. The kernel log is not readable."""
    fake_dmesg(tmp_path, monkeypatch, "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1")
    groups = {}

    def counter_of(pid: int) -> Path:
        group = tmp_path / "cgroup" / f"of-{pid}"
        group.mkdir(parents=True, exist_ok=True)
        counter = group / "memory.oom_control"
        if not counter.exists():
            counter.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
        groups[pid] = counter
        return counter

    monkeypatch.setattr(childmod, "oom_counter_file", counter_of)
    child, (rank0, _) = launch_agent(tmp_path)
    assert groups[rank0] in child.cgroup_oom, child.cgroup_oom
    groups[rank0].write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")  # what the kernel counts
    rc, death = kill_rank_and_classify(child, rank0)
    assert rc == 1 and death.cause == "oom_kill", death
    assert death.detail == (f"SIGKILL by the OOM killer ({groups[rank0]}: oom_kill 0 -> 1, the memory cgroup of "
                            f"rank 0 (pid {rank0}))"), death


def test_a_counter_the_ranks_share_with_the_agent_names_the_rank_from_the_kernel_log(tmp_path, monkeypatch):
    """The whole run in one memory cgroup (the usual case): its counter says an OOM kill, not whose; the kernel log's
    record of a rank's pid says which rank."""
    fake_dmesg(tmp_path, monkeypatch, f"echo \"[{NOW}] oom-kill:constraint=CONSTRAINT_MEMCG,task=python,"
                                      f"pid=$(cat {tmp_path}/pids/rank0),uid=0\"")
    shared = tmp_path / "cgroup" / "run" / "memory.events"
    shared.parent.mkdir(parents=True)
    shared.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")  # cgroup v2's
    monkeypatch.setattr(childmod, "oom_counter_file", lambda pid: shared)
    child, (rank0, _) = launch_agent(tmp_path)
    assert list(child.cgroup_oom) == [shared], child.cgroup_oom
    shared.write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n")
    rc, death = kill_rank_and_classify(child, rank0)
    assert rc == 1 and death.detail == (f"SIGKILL by the OOM killer ({shared}: oom_kill 0 -> 1; kernel log names pid "
                                        f"{rank0}, torchrun rank 0)"), death


def test_a_child_of_the_agent_with_no_rank_in_its_environment_is_not_taken_for_a_rank(tmp_path):
    """Found between the agent's fork and its exec, a worker was named "a worker" for good, and its OOM kill then
    said "torchrun a worker" (under load, where that window is wide): it is left for the next scan instead."""
    child, (rank0, rank1) = launch_agent(tmp_path, NOT_YET_A_RANK)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "pids" / "norank").exists():
            assert time.monotonic() < deadline, "the stand-in child never started"
            time.sleep(0.02)
        norank = int((tmp_path / "pids" / "norank").read_text())
        assert norank in {pid for pid, _ in child.launch_pids()}  # of this launch, the agent's child: only RANK differs
        assert sorted((r.pid, r.name) for r in ranks_among(child.pid, child.launch_pids(), set())) == [
            (rank0, "rank 0"), (rank1, "rank 1")]
        assert sorted((r.pid, r.name) for r in child.ranks) == [(rank0, "rank 0"), (rank1, "rank 1")], child.ranks
    finally:
        child.kill_rest()
        child.popen.wait(60)


def test_a_hand_sent_kill_of_a_rank_says_the_ranks_pids_were_looked_for(tmp_path, monkeypatch):
    fake_dmesg(tmp_path, monkeypatch, "echo '[ 1.0] eth0: link up'; echo '[ 2.0] Killed process 1 (init)'")
    child, (rank0, rank1) = launch_agent(tmp_path)
    child.cgroup_oom = {}
    _, death = kill_rank_and_classify(child, rank0)
    assert death.cause == "killed", death
    assert (f"the kernel log holds no OOM record of pid {child.pid}, nor of rank 0's pid {rank0}, nor of rank 1's "
            f"pid {rank1})") in death.detail, death.detail


@pytest.mark.parametrize("command,ranks", [
    (["python", "-m", "minilmd.trainer.loop.torchrun", "--standalone", "--nproc_per_node", "2", "-m", "x"], 2),
    (["python", "-m", "minilmd.trainer.loop.rendezvous", "--nnodes", "2", "--nproc-per-node", "4"], 4),
    (["torchrun", "--nproc_per_node=3", "train.py"], 3),
    (["torchrun", "--nproc_per_node", "gpu", "train.py"], None),
    (["torchrun", "--nproc_per_node"], None),
])
def test_how_many_ranks_a_torchrun_command_starts(command, ranks):
    assert expected_ranks(command) == ranks
