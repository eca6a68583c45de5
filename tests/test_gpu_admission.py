"""GPU admission against the real pynvml over a fake NVML library (tests/fakes_nvml.py `FakeNvmlLib`): v2 memory and
v1 with the driver's reserve, process listings of older drivers, MIG refused, the numbers in `minilmd status`, and
"the GPU was taken" after a CUDA OOM judged from foreign and own processes (a real process as our trainer)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fakes_nvml import FREE, FakeNvml, FakeNvmlLib, busy
from minilmd.config import GpuSection, RunConfig
from minilmd.daemon.base.runstate import RunState
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.child import orphans
from minilmd.daemon.child import process as childmod
from minilmd.daemon.host.gpu import GpuAdmission, cuda_visible_devices
from minilmd.daemon.host.nvml import PynvmlBackend, v1_reserve_allowance_mib
from minilmd.daemon.phases.gpuwait import GpuReady, GpuUnavailable, GpuWaiter
from minilmd.daemon.views.status import summary_lines

IDLE = busy(used_mib=7)
"""An idle H200 as v2 reads it; v1 adds the driver's reserve (FakeNvmlLib.reserved_mib, 900 MiB)."""


def section(tmp_path, **kw) -> GpuSection:
    return GpuSection(lock_dir=str(tmp_path / "locks"), **{"stable_polls": 1, **kw})


def test_an_idle_card_is_free_with_v2_memory_and_with_v1_judged_against_the_reserve(tmp_path):
    with FakeNvmlLib(FakeNvml([[IDLE]])).installed() as nv:
        d = GpuAdmission(PynvmlBackend(nv), section(tmp_path)).poll().devices[0]
        assert d.free and d.used_mib == 7 and d.fallbacks == []
        assert "used 7 MiB <= 200" in d.checks
        # the call the backend used to make: v1, whose 907 MiB against 200 kept an idle card busy forever
        assert nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(0)).used // 2**20 == 907

    old_driver = FakeNvmlLib(FakeNvml([[IDLE], [busy(used_mib=10240)]]), memory_v2=False)
    with old_driver.installed() as nv:
        report = GpuAdmission(PynvmlBackend(nv), section(tmp_path)).poll()
    allowance = v1_reserve_allowance_mib(FakeNvml([]).total_mib)
    idle, job = report.devices
    assert idle.free and idle.used_mib == 907
    assert f"used 907 MiB <= 200 + {allowance} (v1 counts the driver's reserve)" in idle.checks
    assert not job.free and job.used_mib == 10240 + 900  # a real job's gigabytes stay busy under v1
    assert any(r.startswith(f"11140 MiB used > 200 + {allowance}") for r in job.reasons)
    assert "FunctionNotFound" in idle.fallbacks[0] and "memory v1" in idle.fallbacks[0]
    assert "fallback: memory v1" in report.summary()


def test_process_listing_falls_back_from_v3_to_v2_to_memory_alone(tmp_path):
    job = busy(used_mib=7, procs=[(4242, 300)])
    with FakeNvmlLib(FakeNvml([[job]]), listings=("v2",)).installed() as nv:
        with pytest.raises(nv.NVMLLibraryMismatchError):  # the unversioned call on such a driver
            nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(0))
        d = GpuAdmission(PynvmlBackend(nv), section(tmp_path)).poll().devices[0]
    assert not d.free and d.foreign_processes == [(4242, 300)]
    assert d.fallbacks == ["compute processes listed with v2 (v3: NVMLError_FunctionNotFound: Function Not Found)"]

    with FakeNvmlLib(FakeNvml([[job], [busy(used_mib=4000, procs=[(4243, 4000)])]]), listings=()).installed() as nv:
        backend = PynvmlBackend(nv)
        adm = GpuAdmission(backend, section(tmp_path))
        first, second = adm.poll().devices
        assert adm.poll().devices[0].free  # the missing calls are not asked again, and nothing fails
    assert first.free and first.foreign_processes == []  # unlisted: judged by memory, 7 MiB
    assert not second.free and second.reasons == ["4000 MiB used > 200 MiB allowed"]
    assert "admission by memory and utilisation alone" in first.fallbacks[0]


def test_a_mig_card_without_instances_is_refused_with_the_reason_and_the_others_admitted(tmp_path):
    lib = FakeNvmlLib(FakeNvml([[busy(mig=True)], [IDLE]]))
    with lib.installed() as nv:
        adm = GpuAdmission(PynvmlBackend(nv), section(tmp_path), run_name="r")
        mig, plain = adm.poll().devices
        lease = adm.try_acquire(1)
    assert mig.mig and not mig.free and "MIG mode is enabled" in mig.reasons[0]
    assert "no MIG instance is configured" in mig.reasons[0]
    assert "-mig 0" not in mig.reasons[0]  # never the advice to disable MIG: it harms the card's other users
    assert plain.free and not plain.mig
    assert lease is not None and cuda_visible_devices(lease) == "GPU-fake-0001"
    lease.release()

    cfg = RunConfig()
    cfg.gpu = section(tmp_path)
    all_mig = FakeNvmlLib(FakeNvml([[busy(mig=True)]]))
    with all_mig.installed() as nv:
        waiter = GpuWaiter(cfg, _Infra(PynvmlBackend(nv)), RunState(tmp_path / "state.json", {}),
                           lambda *a, **k: None)
        outcome = waiter.tick()
    assert isinstance(outcome, GpuUnavailable) and "every GPU NVML sees is in MIG mode" in outcome.error

    with FakeNvmlLib(FakeNvml([[IDLE]]), mig_supported=False).installed() as nv:
        assert GpuAdmission(PynvmlBackend(nv), section(tmp_path)).poll().devices[0].free  # no MIG: not refused


def test_status_shows_the_numbers_compared_and_the_fallback(tmp_path):
    events = []
    cfg = RunConfig()
    cfg.gpu = section(tmp_path, stable_polls=3, poll_interval="0s")
    state = RunState(tmp_path / "state.json", {})
    with FakeNvmlLib(FakeNvml([[IDLE]]), memory_v2=False, listings=("v2",)).installed() as nv:
        waiter = GpuWaiter(cfg, _Infra(PynvmlBackend(nv)), state, lambda kind, msg, **d: events.append(msg))
        assert waiter.tick() is None
        now = time.time()
        shown = StateJson(phase="waiting_gpu", gpu_wait=state.gpu_wait, run="r")
        lines = summary_lines(shown, True, now)
        assert waiter.tick() is None
        ready = waiter.tick()
    text = "\n".join(lines)
    assert "GPU 0: free: 0 foreign processes, used 907 MiB <= 200 + 2875 (v1 counts the driver's reserve), " \
           "utilisation 0% <= 0%" in text
    assert "    fallback: memory v1: no v2 memory query (NVMLError_FunctionNotFound" in text
    assert "    fallback: compute processes listed with v2" in text
    said = [m for m in events if "NVML fallback" in m]
    assert len(said) == 2  # each fallback once, not every poll
    assert isinstance(ready, GpuReady) and "used 907 MiB <= 200 + 2875" in ready.reason
    waiter.release()


def test_after_a_cuda_oom_the_gpu_is_judged_from_foreign_and_own_processes(tmp_path):
    """Our trainer is a real process recorded in trainer.json (childmod.launch), found as own by
    orphans.find_orphans as the supervisor does; NVML lists it with another process or alone."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trainer = childmod.launch([sys.executable, "-c", "import time; time.sleep(600)"], run_dir, 1, "")
    try:
        _wait_until(lambda: orphans.find_orphans(run_dir) == [trainer.pid])
        mine = (trainer.pid, 30000)
        nvml = FakeNvml([[busy(used_mib=30000, procs=[mine])]])
        cfg = RunConfig()
        cfg.gpu = section(tmp_path, poll_interval="0s")
        waiter = GpuWaiter(cfg, _Infra(nvml), RunState(tmp_path / "state.json", {}), lambda *a, **k: None,
                           own_pids=lambda: orphans.find_orphans(run_dir))
        nvml.set(0, FREE)
        assert isinstance(waiter.tick(), GpuReady)

        nvml.set(0, busy(used_mib=30000, procs=[mine]))  # our straggler still holds its memory: not taken
        taken, why = waiter.gpu_taken()
        assert not taken and "0 foreign processes (1 of this run)" in why
        nvml.set(0, busy(used_mib=50000, procs=[mine, (4242, 20000)]))
        assert waiter.gpu_taken() == (True, "GPU 0: foreign pid 4242 (20000 MiB)")
        nvml.set(0, busy(used_mib=50000, procs=[mine]))  # 20000 MiB of a process NVML does not list to us
        taken, why = waiter.gpu_taken()
        assert taken and f"30000 MiB of it by this run's processes [{trainer.pid}]: 20000 MiB > 200 MiB" in why

        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        try:  # a process of ours that is not this run's trainer is foreign
            nvml.set(0, busy(used_mib=30000, procs=[(other.pid, 30000)]))
            assert waiter.gpu_taken()[0] is True
        finally:
            other.kill()
            other.wait()
        waiter.release()
    finally:
        trainer.kill_group()


class _Infra:
    def __init__(self, nvml):
        self.nvml = nvml

    def open_gpu(self, cfg):
        return GpuAdmission(self.nvml, cfg.gpu, run_name=cfg.run.name)


def _wait_until(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)
