"""A real memory-cgroup OOM kill of the trainer (cgroup v1 under /sys/fs/cgroup/memory), through `minilmd run`.

The trainer command is wrapped (MINILMD_TRAINER_CMD, tests/reliability_oom_wrapper.py) so that the child joins a
memory cgroup with a hard limit and, once, allocates past it: the kernel kills it with SIGKILL. The supervisor must
classify that death as an OOM kill from the cgroup's oom_kill counter (not a generic SIGKILL), restart it, and
finish with the weights of an undisturbed run.
"""
from __future__ import annotations

import sys
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
    config = write_config(tmp_path, corpus, remote=False, train={"max_steps": 40})
    cfg = load_config(config)
    command = f"{sys.executable} {WRAPPER} {group.path} {marker} {FAKE_TRAINER}"
    assert run_supervisor(config, tmp_path, timeout=120, MINILMD_TRAINER_CMD=command, FAKE_STEP_S="0.05") == 0
    assert marker.exists() and group.oom_kills() >= 1
    restarts = state(cfg.run_dir)["restarts"]
    assert [(r["cause"], r["exit"]) for r in restarts] == [("oom_kill", -9)], restarts
    assert "oom_kill" in restarts[0]["detail"] and str(group.path) in restarts[0]["detail"]
    final = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    assert fake_weights_of(final) == undisturbed_fake_weights(config)
