"""GPU admission against a fake NVML: busy, free, flapping, foreign processes, leases between runs, count > 1."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fakes_nvml import FREE, FakeNvml, busy
from minilmd.config import GpuSection
from minilmd.daemon.host.gpu import GpuAdmission, cuda_visible_devices, open_nvml_or_reason

TESTS = Path(__file__).parent


def gpu_section(tmp_path, **kw) -> GpuSection:
    return GpuSection(lock_dir=str(tmp_path / "locks"), **{"stable_polls": 3, **kw})


def polls_until_lease(adm: GpuAdmission, count: int = 1, limit: int = 20):
    for n in range(1, limit + 1):
        lease = adm.try_acquire(count)
        if lease is not None:
            return n, lease
    return None, None


def test_free_device_is_leased_after_stable_polls(tmp_path):
    adm = GpuAdmission(FakeNvml([[FREE]]), gpu_section(tmp_path), run_name="a")
    n, lease = polls_until_lease(adm)
    assert n == 3
    assert lease.devices == [0]
    assert cuda_visible_devices(lease) == "GPU-fake-0000"
    assert (tmp_path / "locks" / "gpu-GPU-fake-0000.lock").exists()
    lease.release()


def test_busy_device_reports_why_and_since_when(tmp_path):
    clock = iter(range(1000, 2000, 30))
    nvml = FakeNvml([[busy(used_mib=49500, utilization=97, procs=[(4242, 49500)])]])
    adm = GpuAdmission(nvml, gpu_section(tmp_path), clock=lambda: next(clock))
    assert polls_until_lease(adm, limit=5) == (None, None)
    report = adm.poll()
    d = report.devices[0]
    assert not d.free
    assert d.foreign_processes == [(4242, 49500)]
    assert any("pid 4242 (49500 MiB)" in r for r in d.reasons)
    assert any("49500 MiB used > 200 MiB" in r for r in d.reasons)
    assert any("utilisation 97% > 0%" in r for r in d.reasons)
    assert d.since == 1000  # busy since the first poll
    assert "busy for 2m" in report.summary()  # 5 polls 30 s apart after the first
    assert report.ready() == []


def test_used_memory_and_utilisation_limits(tmp_path):
    nvml = FakeNvml([[busy(used_mib=200, utilization=0)], [busy(used_mib=201)], [busy(utilization=1)]])
    adm = GpuAdmission(nvml, gpu_section(tmp_path, stable_polls=1))
    report = adm.poll()
    assert [d.free for d in report.devices] == [True, False, False]
    adm2 = GpuAdmission(nvml, gpu_section(tmp_path, stable_polls=1, max_utilization=5, max_used_mib=300))
    assert all(d.free for d in adm2.poll().devices)


def test_flapping_device_resets_the_stable_count(tmp_path):
    flap = [FREE, FREE, busy(utilization=30), FREE, FREE, busy(procs=[(77, 500)]), FREE, FREE, FREE]
    adm = GpuAdmission(FakeNvml([flap]), gpu_section(tmp_path))
    n, lease = polls_until_lease(adm)
    assert n == 9  # the first three free polls in a row end at poll 9
    assert [adm.last_report.devices[0].stable_polls] == [3]
    lease.release()


def test_own_processes_are_not_foreign(tmp_path):
    nvml = FakeNvml([[busy(procs=[(os.getpid(), 100)])]])
    assert not GpuAdmission(nvml, gpu_section(tmp_path, stable_polls=1)).poll().devices[0].free
    adm = GpuAdmission(nvml, gpu_section(tmp_path, stable_polls=1), own_pids=[os.getpid()])
    assert adm.poll().devices[0].free


def test_poll_then_try_acquire_counts_once(tmp_path):
    adm = GpuAdmission(FakeNvml([[FREE]]), gpu_section(tmp_path))
    for _ in range(2):
        adm.poll()
        assert adm.try_acquire(1) is None
    adm.poll()
    lease = adm.try_acquire(1)
    assert lease is not None and adm.last_report.devices[0].stable_polls == 3
    lease.release()


def test_count_greater_than_one_takes_all_or_none(tmp_path):
    nvml = FakeNvml([[busy(procs=[(9, 9000)])], [FREE], [FREE], [busy(used_mib=5000)]])
    adm = GpuAdmission(nvml, gpu_section(tmp_path, stable_polls=2))
    assert polls_until_lease(adm, count=3, limit=6) == (None, None)  # only two free cards
    n, lease = polls_until_lease(adm, count=2)
    assert n == 1  # stability already counted by the earlier polls
    assert lease.devices == [1, 2]
    assert cuda_visible_devices(lease) == "GPU-fake-0001,GPU-fake-0002"
    report = adm.poll()
    assert report.ready() == [1, 2]
    assert "leased by this run" in report.summary()
    lease.release()
    assert not lease.held


def test_two_runs_in_one_process_never_share_a_card(tmp_path):
    nvml = FakeNvml([[FREE], [FREE]])
    a = GpuAdmission(nvml, gpu_section(tmp_path, stable_polls=1), run_name="run-a")
    b = GpuAdmission(nvml, gpu_section(tmp_path, stable_polls=1), run_name="run-b")
    lease_a = a.try_acquire(1)
    lease_b = b.try_acquire(1)
    assert lease_a.devices == [0] and lease_b.devices == [1]
    report = b.poll()
    assert report.devices[0].reasons == [f"leased by run run-a pid {os.getpid()} on {os.uname().nodename}"]
    assert b.try_acquire(1) is None  # nothing left
    lease_a.release()
    lease = b.try_acquire(1)
    assert lease is not None and lease.devices == [0]
    lease.release()
    lease_b.release()


HOLDER = textwrap.dedent("""
    import sys, time
    from fakes_nvml import FakeNvml, FREE
    from minilmd.daemon.host.gpu import GpuAdmission
    from minilmd.config import GpuSection
    adm = GpuAdmission(FakeNvml([[FREE]]), GpuSection(lock_dir=sys.argv[1], stable_polls=1), run_name="other")
    lease = adm.try_acquire(1)
    print("leased" if lease else "refused", flush=True)
    time.sleep(60)
""")


def test_lease_held_by_another_process_makes_the_card_busy_until_it_dies(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "locks")], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "leased"
        adm = GpuAdmission(FakeNvml([[FREE]]), gpu_section(tmp_path, stable_polls=2), run_name="mine")
        assert polls_until_lease(adm, limit=4) == (None, None)
        assert f"leased by run other pid {child.pid}" in adm.last_report.summary()
        child.send_signal(signal.SIGKILL)  # the kernel drops its flock; no cleanup by the dead run needed
        child.wait(timeout=10)
        n, lease = polls_until_lease(adm)
        assert n == 2 and lease.devices == [0]
        lease.release()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()


def test_lost_race_resets_stability(tmp_path):
    nvml = FakeNvml([[FREE]])
    a = GpuAdmission(nvml, gpu_section(tmp_path, stable_polls=1), run_name="a")
    b = GpuAdmission(nvml, gpu_section(tmp_path, stable_polls=1), run_name="b")
    b.poll()  # b sees the card free...
    lease_a = a.try_acquire(1)  # ...but a takes it first
    assert lease_a is not None
    assert b.try_acquire(1) is None
    assert b._stable[0] == 0
    lease_a.release()


def test_no_driver_means_none_with_a_reason():
    reason = open_nvml_or_reason()
    if not isinstance(reason, str):
        pytest.skip("this machine has an NVIDIA driver")
    assert "NVIDIA" in reason or "NVML" in reason


def test_real_nvml_when_a_driver_is_present(tmp_path):
    nvml = open_nvml_or_reason()
    if isinstance(nvml, str):
        pytest.skip(f"no NVML here: {nvml}")
    report = GpuAdmission(nvml, gpu_section(tmp_path, stable_polls=1)).poll()
    assert len(report.devices) == nvml.device_count() > 0
    assert all(d.uuid.startswith(("GPU-", "MIG-")) and d.used_mib >= 0 for d in report.devices)
    assert report.summary().startswith("GPU 0 (")


class BrokenNvml(FakeNvml):
    """Device 1 is lost (as with NVML_ERROR_GPU_IS_LOST); with `all_lost` the whole query fails."""

    all_lost = False

    def device_count(self) -> int:
        if self.all_lost:
            raise RuntimeError("Driver Not Loaded")
        return super().device_count()

    def memory(self, i: int):
        if i == 1:
            raise RuntimeError("GPU is lost")
        return super().memory(i)


def test_nvml_errors_make_devices_busy_without_stopping_the_wait(tmp_path):
    nvml = BrokenNvml([[FREE], [FREE]])
    adm = GpuAdmission(nvml, gpu_section(tmp_path, stable_polls=1))
    report = adm.poll()
    assert [d.free for d in report.devices] == [True, False]
    assert report.devices[1].reasons == ["NVML query failed: RuntimeError: GPU is lost"]
    assert adm.try_acquire(2) is None
    nvml.all_lost = True
    report = adm.poll()
    assert report.devices == [] and "Driver Not Loaded" in report.summary()
    assert adm.try_acquire(1) is None
