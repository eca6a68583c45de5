"""Fault injection (MINILMD_FAULT): each kind dies the way the real failure does, and fires once per run."""
import os
import signal
import subprocess
import sys

import pytest
import torch

from minilmd.names import FAULT_ENV, FAULTS_FIRED
from minilmd.trainer.loop.faults import Fault, FaultInjector, FaultSpecError, parse_faults
from waiting import wait_until

FIRE_AT_STEP_3 = """
import faulthandler, os, signal, sys
from minilmd.trainer.loop.faults import FaultInjector
faulthandler.register(signal.SIGUSR1, open(os.path.join(sys.argv[1], "stack.txt"), "w"))  # where it is, on demand
inj = FaultInjector(sys.argv[1], sys.argv[2])
for step in range(5):
    inj.maybe_fire(step)
print("survived", flush=True)
"""


def run_injector(run_dir, spec, timeout=60, env=None):
    return subprocess.run([sys.executable, "-c", FIRE_AT_STEP_3, str(run_dir), spec], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_parse_faults():
    assert parse_faults("oom@3, sigkill@10") == [Fault("oom", 3), Fault("sigkill", 10)]
    assert parse_faults("") == []
    for bad in ("oom", "boom@3", "oom@x", "oom@-1"):
        with pytest.raises(FaultSpecError, match=FAULT_ENV):
            parse_faults(bad)


def test_injector_reads_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "exception@2")
    inj = FaultInjector(tmp_path)
    inj.maybe_fire(1)
    with pytest.raises(RuntimeError, match="injected"):
        inj.maybe_fire(2)


def test_sigbus_is_a_real_sigbus_and_leaves_nothing_in_the_temporary_directory(tmp_path):
    """Issue 39: each injected SIGBUS (every `make demo`) left an empty minilmd-sigbus-* file in $TMPDIR."""
    (tmp_path / "tmp").mkdir()
    p = run_injector(tmp_path, "sigbus@3", env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    assert p.returncode == -signal.SIGBUS, p.stderr
    assert "survived" not in p.stdout
    assert (tmp_path / FAULTS_FIRED).read_text().split() == ["sigbus@3"]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_sigkill_kills_and_is_recorded_first(tmp_path):
    p = run_injector(tmp_path, "sigkill@3")
    assert p.returncode == -signal.SIGKILL
    assert (tmp_path / FAULTS_FIRED).read_text().split() == ["sigkill@3"]


def test_exception_is_an_ordinary_crash(tmp_path):
    p = run_injector(tmp_path, "exception@1")
    assert p.returncode == 1 and "RuntimeError: injected exception" in p.stderr


def test_oom_raises_torch_out_of_memory(tmp_path):
    inj = FaultInjector(tmp_path, "oom@0")
    with pytest.raises(torch.OutOfMemoryError):
        inj.maybe_fire(0)


def test_hang_never_returns(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", FIRE_AT_STEP_3, str(tmp_path), "hang@2"],
                            stdout=subprocess.PIPE, text=True)
    stack = tmp_path / "stack.txt"

    def inside_the_hang() -> bool:
        if not (tmp_path / FAULTS_FIRED).exists():  # the fault is recorded, so SIGUSR1 has its handler by now
            return False
        proc.send_signal(signal.SIGUSR1)  # the process dumps its stack to stack.txt
        return " in _hang" in stack.read_text()

    try:
        wait_until(inside_the_hang, 30, "the stack of the process to show it inside the hang")
        assert proc.poll() is None, "a hung trainer must stay alive"
    finally:
        proc.kill()
        out, _ = proc.communicate()
    assert "survived" not in out
    assert proc.returncode == -signal.SIGKILL


def test_each_fault_fires_once_per_run_across_restarts(tmp_path):
    assert run_injector(tmp_path, "sigkill@3").returncode == -signal.SIGKILL
    again = run_injector(tmp_path, "sigkill@3,exception@4")  # the restart: sigkill is already fired
    assert again.returncode == 1 and "RuntimeError" in again.stderr
    third = run_injector(tmp_path, "sigkill@3,exception@4")
    assert third.returncode == 0 and "survived" in third.stdout
    assert (tmp_path / FAULTS_FIRED).read_text().split() == ["sigkill@3", "exception@4"]


def test_ranks_other_than_zero_inject_nothing(tmp_path):
    FaultInjector(tmp_path, "exception@0", enabled=False).maybe_fire(0)
    assert not (tmp_path / FAULTS_FIRED).exists()
