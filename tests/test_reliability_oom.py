"""A real memory-cgroup OOM kill of the trainer (cgroup v1 under /sys/fs/cgroup/memory), through `minilmd run`.

The trainer command is wrapped (MINILMD_TRAINER_CMD, tests/reliability_oom_wrapper.py) so that the child joins a
memory cgroup with a hard limit and, once, allocates past it: the kernel kills it with SIGKILL. The supervisor must
classify that death as an OOM kill from the cgroup's oom_kill counter (not a generic SIGKILL), restart it, and
finish with the weights of an undisturbed run.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs
from minilmd.config import load_config
from reliability_helpers import fake_weights_of, undisturbed_fake_weights
from supervisor_helpers import FAKE_TRAINER, run_supervisor, state, write_config

pytestmark = pytest.mark.slow  # a supervised run in a memory cgroup

WRAPPER = Path(__file__).with_name("reliability_oom_wrapper.py")


def test_a_memory_cgroup_oom_kill_is_classified_as_such_and_survived(tmp_path, corpus, memory_cgroup):
    group = memory_cgroup("256m")
    marker = tmp_path / "hog-fired"
    config = write_config(tmp_path, corpus, remote=False, train={"max_steps": 100})
    cfg = load_config(config)
    command = f"{sys.executable} {WRAPPER} {group.path} {marker} {FAKE_TRAINER}"
    assert run_supervisor(config, tmp_path, timeout=120, MINILMD_TRAINER_CMD=command, FAKE_STEP_S="0.05") == 0
    assert marker.exists() and group.oom_kills() >= 1
    restarts = state(cfg.run_dir)["restarts"]
    assert [(r["cause"], r["exit"]) for r in restarts] == [("oom_kill", -9)], restarts
    assert "oom_kill" in restarts[0]["detail"] and str(group.path) in restarts[0]["detail"]
    final = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    assert fake_weights_of(final) == undisturbed_fake_weights(config)


def test_an_oom_kill_counted_in_the_group_the_dying_child_left_is_still_seen(tmp_path, memory_cgroup):
    """Under cgroup v1 a process the OOM killer has taken shows the root memory cgroup while it exits: a supervisor
    tick that reads its cgroup then must not forget the group that counted the kill."""
    from minilmd.daemon.child.death import classify
    from minilmd.daemon.child.oomevidence import oom_counter_file
    from minilmd.daemon.child.process import launch

    group = memory_cgroup("64m")
    go = tmp_path / "go"
    code = (f"import os, time; open({str(group.path / 'cgroup.procs')!r}, 'w').write('0')\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
            "chunks = []\nwhile True: chunks.append(bytearray(8 << 20))\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    child = launch([sys.executable, "-c", code], run_dir, 1, devices="")
    deadline = time.monotonic() + 30
    while oom_counter_file(child.pid) != group.path / "memory.oom_control":
        assert time.monotonic() < deadline and child.poll() is None, "the child never joined its group"
        time.sleep(0.01)
    child.track_cgroup()
    go.touch()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: /proc still shows it
    dying_view = oom_counter_file(child.pid)
    child.track_cgroup()  # what the supervisor's tick does when it reads the child between kill and reap
    rc = child.popen.wait(30)
    death = classify(child, rc, run_dir, stop_requested=False)
    assert rc == -9 and group.oom_kills() >= 1
    assert death.cause == "oom_kill" and str(group.path) in death.detail, (death, dying_view)


def test_the_hierarchy_root_a_child_is_seen_in_later_is_not_watched(tmp_path, memory_cgroup):
    """The root of the memory hierarchy as mounted (in a container, the container's own group) counts the OOM kills
    of every group below it: a child first seen in its own group and later in the root (as a dying v1 process shows)
    must not have its SIGKILL read as an OOM kill because another run's group below the root had one."""
    from minilmd.daemon.child.oomevidence import HIERARCHY_ROOTS, oom_counter_file
    from minilmd.daemon.child.process import launch

    root_procs = next((r / "cgroup.procs" for r in HIERARCHY_ROOTS if (r / "memory.oom_control").exists()), None)
    if root_procs is None:
        pytest.skip("no cgroup v1 memory hierarchy root with an oom_kill counter here")
    group = memory_cgroup("256m")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    child = launch([sys.executable, "-c", "import time; time.sleep(60)"], run_dir, 1, devices="")
    try:
        (group.path / "cgroup.procs").write_text(str(child.pid))
        child.track_cgroup()
        assert group.path / "memory.oom_control" in child.cgroup_oom
        root_procs.write_text(str(child.pid))
        assert oom_counter_file(child.pid) == root_procs.with_name("memory.oom_control")
        child.track_cgroup()
        assert root_procs.with_name("memory.oom_control") not in child.cgroup_oom, child.cgroup_oom
    finally:
        child.popen.kill()
        child.popen.wait(30)
