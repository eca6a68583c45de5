"""OMP_NUM_THREADS for the trainer (daemon/child.py `trainer_threads`): one per torchrun rank and per GPU trainer,
every core for a single CPU trainer, and a value set for the supervisor never overridden; checked in the
environment a really launched child sees and in its attempt log."""
from __future__ import annotations

import os
import sys

from minilmd.daemon import child as childmod

PRINT_THREADS = [sys.executable, "-c", "import os; print('threads', os.environ['OMP_NUM_THREADS'])"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "x"]


def test_the_rule_for_each_kind_of_trainer():
    cores = str(len(os.sched_getaffinity(0)))
    assert childmod.trainer_threads(PRINT_THREADS, "", {}) == (cores, "a single CPU trainer: every core it may run on")
    assert childmod.trainer_threads(TORCHRUN, "GPU-a,GPU-b", {})[0] == "1"
    assert childmod.trainer_threads(TORCHRUN, "", {})[0] == "1"  # torchrun on the CPU: ranks x threads <= cores
    assert childmod.trainer_threads(PRINT_THREADS, "GPU-a", {})[0] == "1"
    assert childmod.trainer_threads(TORCHRUN, "", {"OMP_NUM_THREADS": "3"}) == ("3", "set for the supervisor, kept")


def test_a_launched_cpu_trainer_sees_every_core_unless_the_user_set_a_value(tmp_path, monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    first = childmod.launch(PRINT_THREADS, tmp_path, 1, "")
    assert first.popen.wait(timeout=30) == 0
    log = first.log_path.read_text()
    assert f"\nthreads {cores}\n" in log
    assert f"# OMP_NUM_THREADS={cores} (a single CPU trainer: every core it may run on)" in log

    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    second = childmod.launch(PRINT_THREADS, tmp_path, 2, "GPU-x")
    assert second.popen.wait(timeout=30) == 0
    assert "\nthreads 7\n" in second.log_path.read_text()
