"""What `run --check` and the launch say of the GPU lease files before any wait (daemon/preflight.py puts them among
the waits, never the refusals): a gpu.lock_dir unsafe to lease in (lock_dir_wait), and each card whose lease file no
lease of this user's is taken through (lease_file_waits). The wait itself says the same of each card it polls
(daemon/host/gpu.py GpuAdmission, daemon/host/leases.py's words). Nothing is made or locked. Torch-free.
"""
from __future__ import annotations

from pathlib import Path

from minilmd.config import RunConfig
from minilmd.daemon.host import leases
from minilmd.daemon.host.gpu import Nvml, device_uuid, first_instance_index, lease_name
from minilmd.daemon.host.nvml import open_nvml_or_reason


def lock_dir_wait(cfg: RunConfig) -> str | None:
    """For `run --check` and the launch (daemon/preflight.py puts it among the waits): gpu.lock_dir unsafe to lease
    in (leases.py lock_dir_problem: another user's directory, one he may rearrange, a link of his), when this run
    leases GPUs: train.device = "cuda", or "auto" where NVML is there; None otherwise. Never a refusal: anyone may
    `mkdir /tmp/minilmd-gpu-locks` before the first run, and exit 2 (final for systemd and the tmux launcher) would
    end every user's run for good. The run waits in waiting_gpu, every device busy with the same words ("lease not
    taken safely: ..."), polling, and leases as soon as an admin has removed or fixed it. No lease is ever taken
    through such a directory: its owner could remove a lease and put two runs on one card."""
    if cfg.train.device == "cpu":
        return None
    problem = leases.lock_dir_problem(cfg.gpu.lock_dir)
    if problem is None or (cfg.train.device == "auto" and isinstance(open_nvml_or_reason(), str)):
        return None  # auto without NVML trains on the CPU: no lease is taken
    return (f"gpu.lock_dir: {problem}; no lease is taken through it: the run waits in waiting_gpu (every GPU busy, "
            f"saying why) and leases once it is removed or fixed")


def lease_file_waits(cfg: RunConfig) -> list[str]:
    """For `run --check` (daemon/preflight.py puts them among the waits): each card here whose lease file in
    gpu.lock_dir no lease of this user's can be taken through (leases.unfit_leases: a link, a FIFO, a hard link,
    another user's file this user's runs cannot open), when this run leases GPUs (as lock_dir_wait) and the lock
    directory itself is fine (else lock_dir_wait's line says it all). Never a refusal: the run waits in waiting_gpu,
    that card busy with the same words, and leases it once the file is removed; the other cards are leased as
    ever. Nothing is made or locked."""
    if cfg.train.device == "cpu" or leases.lock_dir_problem(cfg.gpu.lock_dir):
        return []
    nvml = open_nvml_or_reason()
    if isinstance(nvml, str):
        return []  # "cuda": device_problems refuses; "auto": the CPU, no lease
    try:
        return unfit_lease_files(nvml, cfg.gpu.lock_dir)
    finally:
        nvml.close()


def unfit_lease_files(nvml: Nvml, lock_dir: str | Path) -> list[str]:
    """lease_file_waits' lines for the devices `nvml` sees (MIG instances numbered as GpuAdmission.poll numbers
    them); a card NVML cannot read is the wait's to say."""
    devices: list[tuple[int, str, str]] = []  # (index, name, uuid), as poll() numbers them
    instances: list[tuple[int, str, str]] = []
    try:
        count = nvml.device_count()
    except Exception:  # noqa: BLE001 - NVML errors: the wait polls again and says so
        count = 0
    for i in range(count):
        try:
            if not nvml.mig_enabled(i):
                devices.append((i, nvml.name(i), device_uuid(nvml, i)))
                continue
            get = getattr(nvml, "mig_instances", None)
            first = first_instance_index(count, len(instances))
            instances += [(first + k, m.name, m.uuid) for k, m in enumerate(get(i) if get else [])]
        except Exception:  # noqa: BLE001 - one card NVML cannot read: the wait says so; the others are looked at
            continue
    devices += instances
    names = {lease_name(i, uuid): (i, name) for i, name, uuid in devices}
    found = leases.unfit_leases(Path(lock_dir), names)
    return [f"gpu.lock_dir: GPU {names[lease][0]} ({names[lease][1]}): lease not taken safely: {why}; that GPU "
            f"stays busy for this run: the run waits in waiting_gpu (saying why) while no other is free, and leases "
            f"it once the file is removed" for lease, why in found.items()]
