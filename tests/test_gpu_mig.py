"""MIG instances as devices admission can lease (by their MIG UUID, judged by their own memory and processes), the
refusal of a multi-device run on MIG instances, and an nvidia-ml-py too old for the names the backend calls: all
through the real pynvml over tests/fakes_nvml.py's fake NVML library."""
from __future__ import annotations

import types

import pytest

from fakes_nvml import FakeNvml, FakeNvmlLib, busy, mig
from minilmd.config import GpuSection, RunConfig
from minilmd.daemon.base.runstate import RunState
from minilmd.daemon.host import nvml as nvmlmod
from minilmd.daemon.host.gpu import GpuAdmission, cuda_visible_devices, mig_refusal
from minilmd.daemon.host.nvml import PynvmlBackend, open_nvml_or_reason
from minilmd.daemon.phases.gpuwait import GpuReady, GpuUnavailable, GpuWaiter

IDLE = busy(used_mib=7)


def section(tmp_path, **kw) -> GpuSection:
    return GpuSection(lock_dir=str(tmp_path / "locks"), **{"stable_polls": 1, **kw})


class _Infra:
    def __init__(self, nvml):
        self.nvml = nvml

    def open_gpu(self, cfg):
        return GpuAdmission(self.nvml, cfg.gpu, run_name=cfg.run.name)


def test_each_mig_instance_is_a_device_judged_by_its_own_memory_and_processes(tmp_path):
    # card 0: an H200 in MIG mode with a busy instance (a foreign job), one with leftover memory, one idle
    card = busy(instances=[mig(used_mib=9000, procs=[(4242, 9000)]), mig(used_mib=5000), mig(used_mib=3)])
    lib = FakeNvmlLib(FakeNvml([[card]], names=["NVIDIA H200"]))
    with lib.installed() as nv:
        adm = GpuAdmission(PynvmlBackend(nv), section(tmp_path), run_name="r")
        report = adm.poll()
        lease = adm.try_acquire(1)
    parent, taken, leftover, idle = report.devices
    assert parent.mig and not parent.free and "leased one by one (GPU 1-3)" in parent.reasons[0]
    assert [d.index for d in (taken, leftover, idle)] == [1, 2, 3]
    assert all(d.mig_parent == 0 and not d.mig for d in (taken, leftover, idle))
    assert taken.name == "NVIDIA H200 MIG 1g.18gb" and taken.uuid == "MIG-fake-0000-0"
    assert not taken.free and taken.foreign_processes == [(4242, 9000)]
    assert not leftover.free and "5000 MiB used > 200 MiB allowed" in leftover.reasons
    assert idle.free and "utilisation not reported per MIG instance" in idle.checks
    assert lease is not None and lease.devices == [3] and cuda_visible_devices(lease) == "MIG-fake-0000-2"
    assert "GPU 3 (NVIDIA H200 MIG 1g.18gb, MIG instance of GPU 0): free" in report.summary()
    assert {"nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex"} <= set(lib.calls)

    with lib.installed() as nv:  # a second run on the server: the leased instance is busy for it
        other = GpuAdmission(PynvmlBackend(nv), section(tmp_path), run_name="other").poll().devices[3]
    assert not other.free and any(r.startswith("leased by") for r in other.reasons)
    lease.release()


def test_a_run_asking_for_two_devices_is_never_given_mig_instances_and_is_refused_with_the_reason(tmp_path):
    cfg = RunConfig()
    cfg.gpu = section(tmp_path, count=2)
    cfg.train.device = "cuda"
    lib = FakeNvmlLib(FakeNvml([[busy(instances=[mig(), mig()])], [IDLE]]))
    with lib.installed() as nv:
        adm = GpuAdmission(PynvmlBackend(nv), cfg.gpu)
        report = adm.poll()
        assert adm.try_acquire(2) is None  # one whole card and two free instances: not two devices for DDP
        why = mig_refusal(report, 2)
        waiter = GpuWaiter(cfg, _Infra(PynvmlBackend(nv)), RunState(tmp_path / "state.json", {}), lambda *a, **k: None)
        outcome = waiter.tick()
    assert why is not None and "DDP cannot span MIG instances" in why and "NVML sees 1" in why
    assert isinstance(outcome, GpuUnavailable) and "set gpu.count = 1" in outcome.error
    assert mig_refusal(report, 1) is None

    cfg.gpu = section(tmp_path, count=1, poll_interval="0s")
    with lib.installed() as nv:
        waiter = GpuWaiter(cfg, _Infra(PynvmlBackend(nv)), RunState(tmp_path / "state.json", {}), lambda *a, **k: None)
        ready = waiter.tick()
    assert isinstance(ready, GpuReady) and waiter.devices_env in ("GPU-fake-0001", "MIG-fake-0000-0")
    waiter.release()


def test_a_mig_uuid_of_an_old_driver_makes_a_lock_file_name_without_a_slash(tmp_path):
    from minilmd.daemon.host.gpu import lease_name

    assert lease_name(3, "MIG-GPU-5c89f0ee-ab12/1/0") == "gpu-MIG-GPU-5c89f0ee-ab12-1-0.lock"
    assert lease_name(3, "") == "gpu-index-3.lock"


def _pynvml_without(name: str):
    import pynvml

    fake = types.ModuleType("pynvml")
    fake.__dict__.update({k: v for k, v in vars(pynvml).items() if k != name})
    return fake


@pytest.mark.parametrize("name", ["NVMLLibraryMismatchError", "nvmlDeviceGetComputeRunningProcesses_v2",
                                  "nvmlDeviceGetMigDeviceHandleByIndex"])
def test_a_binding_lacking_a_name_is_nvml_too_old_not_a_busy_card(tmp_path, monkeypatch, name):
    old = _pynvml_without(name)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", old)
    reason = open_nvml_or_reason()
    assert isinstance(reason, str) and reason.startswith("NVML too old: ") and name in reason
    assert f"nvidia-ml-py>={nvmlmod.NVML_PY_FLOOR}" in reason

    cfg = RunConfig()
    cfg.train.device = "cuda"
    cfg.gpu = section(tmp_path)

    class Infra:
        def open_gpu(self, cfg):
            return open_nvml_or_reason()

    outcome = GpuWaiter(cfg, Infra(), RunState(tmp_path / "state.json", {}), lambda *a, **k: None).tick()
    assert isinstance(outcome, GpuUnavailable) and outcome.exit_status == 2 and "NVML too old" in outcome.error


def test_the_missing_call_check_survives_a_binding_without_the_mismatch_error_class():
    old = _pynvml_without("NVMLLibraryMismatchError")
    assert nvmlmod._missing(old, AttributeError("x")) is True
    assert nvmlmod._missing(old, RuntimeError("card lost")) is False  # a failure of the card, not an AttributeError


def test_the_floor_in_pyproject_is_the_backends_floor():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'"nvidia-ml-py>={nvmlmod.NVML_PY_FLOOR}"' in text
