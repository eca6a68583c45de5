"""OMP_NUM_THREADS for the trainer (daemon/child/process.py `trainer_threads`): one per torchrun rank and per GPU
trainer,
the idle cores for a single CPU trainer, and a value set for the supervisor never overridden; checked in the
environment a really launched child sees and in its attempt log."""
from __future__ import annotations

import os
import re
import sys

from minilmd.daemon.child import process as childmod

PRINT_THREADS = [sys.executable, "-c", "import os; print('threads', os.environ['OMP_NUM_THREADS'])"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "x"]


def test_the_rule_for_each_kind_of_trainer():
    def cpu(cores, load):
        return childmod.trainer_threads(PRINT_THREADS, "", {}, cores=cores, load=load)[0]

    assert cpu(32, 0.1) == "32"  # an idle host: every core
    assert cpu(32, 6.4) == "26"  # another job keeps six busy
    assert cpu(2, 3.6) == "1"  # an overloaded host: one thread, never none
    assert childmod.trainer_threads(TORCHRUN, "GPU-a,GPU-b", {}, cores=32, load=0)[0] == "1"
    assert childmod.trainer_threads(TORCHRUN, "", {}, cores=32, load=0)[0] == "1"  # ranks x threads <= cores
    assert childmod.trainer_threads(PRINT_THREADS, "GPU-a", {}, cores=32, load=0)[0] == "1"
    assert childmod.trainer_threads(TORCHRUN, "", {"OMP_NUM_THREADS": "3"}) == (
        "3", "OMP_NUM_THREADS=3 in the environment of the supervisor, kept")


def test_the_why_of_a_single_cpu_trainer_reads_plainly():
    def why(cores, load):
        return childmod.trainer_threads(PRINT_THREADS, "", {}, cores=cores, load=load)[1]

    assert why(32, 6.4) == "a single CPU trainer: 26 of 32 cores idle (load average 6.4)"
    assert why(2, 7.8) == "a single CPU trainer: none of 2 cores idle (load average 7.8), so 1"


def test_a_launched_trainer_gets_the_rule_in_its_environment_and_its_log(tmp_path, monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    first = childmod.launch(PRINT_THREADS, tmp_path, 1, "")
    assert first.popen.wait(timeout=30) == 0
    log = first.log_path.read_text()
    header = re.search(r"# OMP_NUM_THREADS=(\d+) \(a single CPU trainer: (?:\d+|none) of (\d+) cores idle \(load", log)
    assert header is not None and int(header[2]) == cores and 1 <= int(header[1]) <= cores
    assert f"\nthreads {header[1]}\n" in log  # what the child saw is what the header says

    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    second = childmod.launch(PRINT_THREADS, tmp_path, 2, "GPU-x")
    assert second.popen.wait(timeout=30) == 0
    assert "\nthreads 7\n" in second.log_path.read_text()
