"""A real OOM kill of one rank of a 2-rank gloo torchrun (fault9 F4): rank 0 alone is put in a cgroup v1 memory
group with a hard limit and allocates past it; the kernel kills it, the agent (minilmd's torchrun, as the supervisor
starts it) stops rank 1 and exits 1. The supervisor's watch (track_cgroup at each tick) saw the rank and its group
while it lived: the death is an OOM kill naming rank 0 (before: "SIGKILL from outside, not by the OOM killer", only
the agent's pid and cgroup read). The group is removed by the memory_cgroup fixture."""
from __future__ import annotations

import time

import pytest

from minilmd import names, pychild
from minilmd.daemon.child.death import classify
from minilmd.daemon.child.process import launch

pytestmark = pytest.mark.slow  # torch imported by three processes, a real OOM kill

RANKS = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
out = sys.argv[1]
open(f"{out}/rank{rank}.tmp", "w").write(str(os.getpid()))
os.rename(f"{out}/rank{rank}.tmp", f"{out}/rank{rank}")
deadline = time.monotonic() + 600
while not os.path.exists(f"{out}/go"):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.05)
if rank == 0:
    chunks = []
    while True:
        chunks.append(b"x" * (8 << 20))  # every page touched, so charged to the group
time.sleep(600)  # rank 1: until the agent stops it
"""


def test_a_rank_oom_killed_in_its_own_memory_cgroup_is_an_oom_kill_naming_the_rank(tmp_path, memory_cgroup):
    group = memory_cgroup("64m")
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    command = pychild.module_argv(names.TORCHRUN_LAUNCHER, "--standalone", "--nproc_per_node", "2",
                                  "--max-restarts", "0", str(script), str(tmp_path))
    child = launch(command, run_dir, 1, devices="")
    try:
        deadline = time.monotonic() + 300
        while len(child.ranks) < 2 or not all((tmp_path / f"rank{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline and child.poll() is None, child.log_path.read_text()[-3000:]
            child.track_cgroup()  # what the supervisor's tick does
            time.sleep(0.05)
        rank0 = int((tmp_path / "rank0").read_text())
        assert {(r.pid, r.name) for r in child.ranks} >= {(rank0, "rank 0")}, child.ranks
        group.add(rank0)
        counter = group.path / "memory.oom_control"
        while counter not in child.cgroup_oom:
            assert time.monotonic() < deadline, child.cgroup_oom
            child.track_cgroup()
            time.sleep(0.05)
        (tmp_path / "go").touch()
        while child.poll() is None:
            assert time.monotonic() < deadline + 120, "torchrun did not end after its rank's OOM kill"
            child.track_cgroup()
            time.sleep(0.05)
        rc = child.popen.wait(10)
        death = classify(child, rc, run_dir, stop_requested=False)
        assert group.oom_kills() >= 1
        assert rc == 1 and death.cause == "oom_kill", (death, child.log_path.read_text()[-3000:])
        assert f"{counter}: oom_kill 0 -> " in death.detail, death.detail
        assert death.detail.endswith(f", the memory cgroup of rank 0 (pid {rank0}))"), death.detail
    finally:
        child.kill()
        child.kill_rest_and_wait()
        child.popen.wait(60)
