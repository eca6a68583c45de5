"""A GPU lease is an flock on the file at the lease's name. A lease file removed between a run's open and its flock
(by its owner, who may remove what he made; by an admin's clean-up) left that run holding a lock on a file no longer
named, while the next run made a new file at the name and locked it too: two runs on one GPU (review2 F1). Now a
lease holds only where the name still leads to the file locked, asked after the flock; else the name is opened
again (minilmd/daemon/host/leases.py `take`)."""
from __future__ import annotations

import os

from fakes_nvml import FREE, FakeNvml
from minilmd.config import GpuSection
from minilmd.daemon.host import leases
from minilmd.daemon.host.gpu import GpuAdmission


def _admission(lock_dir, run_name: str) -> GpuAdmission:
    return GpuAdmission(FakeNvml([[FREE]]), GpuSection(lock_dir=str(lock_dir), stable_polls=1), run_name=run_name)


def test_a_lease_file_removed_between_the_open_and_the_flock_is_opened_again_and_no_second_run_takes_the_gpu(
        tmp_path, monkeypatch):
    lock_dir = tmp_path / "locks"
    real, removed = leases.try_lock, []

    def removed_first(lease, exclusive):
        if exclusive and not removed:  # the first run's open is done; its file goes before the flock
            os.unlink(lease.path)
            removed.append(lease.path)
        return real(lease, exclusive)

    monkeypatch.setattr(leases, "try_lock", removed_first)
    first = _admission(lock_dir, "first").try_acquire(1)
    monkeypatch.undo()
    assert first is not None and removed, "the first run leases the free device"
    try:
        second = _admission(lock_dir, "second").try_acquire(1)
        if second is not None:
            second.release()
        assert second is None, "a second run leased the device the first one holds"
        assert len(list(lock_dir.iterdir())) == 1  # the first run's lease is the file at the name
    finally:
        first.release()
    again = _admission(lock_dir, "second").try_acquire(1)
    assert again is not None, "once the first run lets go, the device is free again"
    again.release()
