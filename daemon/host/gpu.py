"""Waiting for a GPU on a shared server, without ever touching anyone else's job.

A device is free when NVML shows no compute process on it (other than our own), its used memory is at most
`gpu.max_used_mib` and its utilisation at most `gpu.max_utilization`, for `gpu.stable_polls` polls in a row (one
busy poll resets the count: a job between two epochs looks idle for a moment). A free device is then leased with an
flock on one file per device in `gpu.lock_dir`, so two minilmd runs on the server, of any users, never take the same
card; a card leased by another run is busy ("leased by run X pid Y"). The lock directory is shared by every user's
runs: daemon/host/leases.py opens it and its files without trusting any name in it (a device whose lease file is not
safe to use is busy, and says why). Nothing here signals any process.

Usage, once per `gpu.poll_interval`:
    report = admission.poll()                 # optional: the view for state.json / the log
    lease = admission.try_acquire(gpu.count)  # polls itself unless poll() was just called
Each poll states the numbers it compared (`DeviceStatus.checks`: "used 7 MiB <= 200") and any fallback the
driver forced (`DeviceStatus.fallbacks`: v1 memory, an older process listing, memory alone); daemon/host/nvml.py chooses
the versions. A card in MIG mode is never leased whole: each of its MIG instances is a device of its own, leased by its
UUID (`CUDA_VISIBLE_DEVICES=MIG-...`) and judged by its own memory and compute processes (NVML reports no utilisation
per instance). Instances get the indices after the whole cards' (`DeviceStatus.mig_parent` names their card). A run
asking for more than one device is never given MIG instances (a CUDA process sees one instance, so DDP cannot span
them): with fewer whole cards than `gpu.count`, `mig_refusal()` says why the run can never start. Torch-free; NVML
comes from nvidia-ml-py (`pynvml`), imported only in `open_nvml_or_reason()` (daemon/host/nvml.py).
"""
from __future__ import annotations

import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from minilmd.config import GpuSection, RunConfig
from minilmd.daemon.host import leasekeep, leases
from minilmd.daemon.host.leasekeep import Said
from minilmd.daemon.host.leases import LeaseFile
from minilmd.daemon.host.nvml import MemoryReading, MigInstance, ProcessListing, open_nvml_or_reason
from minilmd.fmt import fmt_duration

if TYPE_CHECKING:
    from minilmd.plan.footprint import Offer

__all__ = ["GpuAdmission", "DeviceLease", "PollReport", "DeviceStatus", "cuda_visible_devices", "mig_refusal",
           "open_nvml_or_reason", "lease_name", "device_uuid"]


class Nvml(Protocol):
    """The few NVML queries admission needs; `PynvmlBackend` (daemon/host/nvml.py) is the real one, tests use
    tests/fakes_nvml.py (a scripted Nvml, and a fake NVML library under the real pynvml)."""

    def device_count(self) -> int: ...

    def name(self, i: int) -> str: ...

    def memory(self, i: int) -> MemoryReading:
        """Used memory, from the v2 query where the driver has it (v1 counts the driver's reserve as used)."""

    def utilization(self, i: int) -> int | None:
        """GPU utilisation in percent, or None where the device cannot report it."""

    def processes(self, i: int) -> ProcessListing:
        """(pid, used MiB) of every compute process on device i, or None where no listing call works."""

    def mig_enabled(self, i: int) -> bool: ...

    def mig_instances(self, i: int) -> list[MigInstance]:
        """The MIG instances of card i (in MIG mode): each one's UUID, name, memory and compute processes."""


MIG_PARENT = ("MIG mode is enabled: the card is not leased whole; {n} MIG instance{s} on it "
              "{are} leased one by one (GPU {first})")
MIG_NO_INSTANCE = ("MIG mode is enabled and no MIG instance is configured on it (nvidia-smi mig -lgi): "
                   "nothing to lease until its administrator creates one")
MIG_NO_DDP = ("gpu.count = {count} needs {count} whole GPUs, NVML sees {whole}: the other {mig} device(s) are MIG "
              "instances, and DDP cannot span MIG instances (a CUDA process sees one instance, NCCL none across "
              "them); set gpu.count = 1 to train on one MIG instance")


@dataclass
class DeviceStatus:
    index: int
    name: str
    uuid: str
    free: bool
    """Free in this poll (all criteria met and not leased by another run)."""
    reasons: list[str]
    """Why it is busy, in words, e.g. "2 foreign processes: pid 4242 (49500 MiB)"; empty when free."""
    used_mib: int
    utilization: int | None
    foreign_processes: list[tuple[int, int]]
    """(pid, MiB) of compute processes that are not this run's."""
    stable_polls: int
    """Consecutive free polls so far."""
    since: float
    """Unix time since which the device has been in its current state (free or busy)."""
    leased_by_us: bool = False
    checks: list[str] = field(default_factory=list)
    """Every comparison of this poll with its numbers, e.g. "used 7 MiB <= 200", "utilisation 0% <= 0%"."""
    fallbacks: list[str] = field(default_factory=list)
    """What the driver made admission do instead of the best query (v1 memory, an older listing, memory alone)."""
    own_processes: list[tuple[int, int]] = field(default_factory=list)
    """(pid, MiB) of compute processes that are this run's (`GpuAdmission.own_pids`)."""
    mig: bool = False
    """A card in MIG mode: never leased whole (its instances are devices of their own)."""
    mig_parent: int | None = None
    """For a MIG instance: the NVML index of its card (its own `index` follows the whole cards')."""
    allowed_mib: int = 0
    """The used memory this poll allowed: gpu.max_used_mib, plus the driver's reserve with v1 memory."""


@dataclass
class PollReport:
    time: float
    devices: list[DeviceStatus]
    stable_polls_needed: int
    error: str | None = None
    """Set when NVML itself failed this poll (then no device counts as free)."""

    def ready(self) -> list[int]:
        """Indices free for stable_polls polls in a row (or already leased by us)."""
        return [d.index for d in self.devices
                if d.leased_by_us or (d.free and d.stable_polls >= self.stable_polls_needed)]

    def summary(self) -> str:
        """A few lines for the supervisor log and `minilmd status`."""
        if self.error:
            return f"NVML query failed: {self.error}"
        if not self.devices:
            return "no GPU found by NVML"
        lines = []
        for d in self.devices:
            age = fmt_duration(self.time - d.since)
            if d.leased_by_us:
                state = "leased by this run"
            elif d.free:
                state = f"free for {d.stable_polls}/{self.stable_polls_needed} polls ({age}): " + ", ".join(d.checks)
            else:
                state = f"busy for {age}: " + "; ".join(d.reasons)
            of = f", MIG instance of GPU {d.mig_parent}" if d.mig_parent is not None else ""
            lines.append(f"GPU {d.index} ({d.name}{of}): {state}")
            lines += [f"  fallback: {f}" for f in d.fallbacks]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"time": self.time, "stable_polls_needed": self.stable_polls_needed, "error": self.error,
                "devices": [asdict(d) for d in self.devices]}


@dataclass
class DeviceLease:
    """Devices this run holds, each by an flock in the shared lock directory. Release it when the child ends for
    good; the kernel releases it if the supervisor dies."""

    devices: list[int]
    uuids: list[str]
    _files: list[LeaseFile] = field(default_factory=list, repr=False)
    _on_release: object = field(default=None, repr=False)

    def release(self) -> None:
        files, self._files = self._files, []
        for lease in files:
            leases.clear_body(lease)  # our own file only: another user's keeps its body
            lease.close()
        if callable(self._on_release):
            self._on_release(self)
            self._on_release = None

    @property
    def held(self) -> bool:
        return bool(self._files)

    def __enter__(self) -> DeviceLease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def cuda_visible_devices(lease: DeviceLease) -> str:
    """The value for the child's CUDA_VISIBLE_DEVICES. UUIDs where NVML gave them: CUDA's own device order may
    differ from NVML's index order unless CUDA_DEVICE_ORDER=PCI_BUS_ID, a UUID means the same card for both."""
    if lease.uuids and all(u.startswith(("GPU-", "MIG-")) for u in lease.uuids):
        return ",".join(lease.uuids)
    return ",".join(str(i) for i in lease.devices)


def taken_from_us(d: DeviceStatus) -> str | None:
    """Why device d counts as taken from this run (after a CUDA OOM): a foreign process on it, or more used memory
    than the poll allowed beyond what this run's own processes hold (a process NVML does not list to us, or no
    listing at all). None when it is ours alone."""
    if d.foreign_processes:
        return f"GPU {d.index}: foreign " + ", ".join(f"pid {p} ({m} MiB)" for p, m in d.foreign_processes)
    own_mib = sum(mib for _, mib in d.own_processes)
    if d.used_mib - own_mib > d.allowed_mib:
        return (f"GPU {d.index}: {d.used_mib} MiB used, {own_mib} MiB of it by this run's processes "
                f"{[p for p, _ in d.own_processes]}: {d.used_mib - own_mib} MiB > {d.allowed_mib} MiB")
    return None


def device_problems(cfg: RunConfig) -> list[str]:
    """For `run --check` and the launch (daemon/preflight.py): train.device = "cuda" where NVML cannot start (no
    driver, no nvidia-ml-py): the launch's GPU wait (daemon/phases/gpuwait.py) stops at once with the same words."""
    if cfg.train.device != "cuda":
        return []
    return [f"train.device = cuda, but {why}"] if (why := _no_nvml()) else []


def cpu_fallback(cfg: RunConfig) -> str:
    """For `run --check`: why train.device = "auto" trains on the CPU here (no NVML: no GPU is ever admitted), and
    that a gpu.count over 1 is then ignored (one trainer process on the CPU: gpuwait's nproc, as on "cpu"), ""
    when neither is so (NVML starts, or the device is set)."""
    why = _no_nvml() if cfg.train.device == "auto" else ""
    said = [f"train.device = auto trains on the CPU here ({why}): set train.device = \"cuda\" to refuse that"] \
        if why else []
    if cfg.gpu.count > 1 and (why or cfg.train.device == "cpu"):
        said.append(f"gpu.count = {cfg.gpu.count} is ignored on the CPU: one trainer process trains (1 rank)")
    return "; ".join(said)


def device_offer(cfg: RunConfig) -> tuple[Offer | None, bool]:
    """(What the device the run trains on offers it, whether it is a GPU), for the memory rule at `run --check` and
    the launch (minilmd/plan/footprint.py): the largest card's total memory where NVML answers and train.device is
    not "cpu" (the supervisor waits for a free card; the trainer judges its own card again at its start), else the
    host's total memory (a CPU run, or "auto" with no NVIDIA driver; what is available now is a note only). None:
    nothing to compare with ("cuda" without NVML, which device_problems refuses; a card that does not answer)."""
    from minilmd.plan.footprint import Offer, host_offer

    if cfg.train.device == "cpu":
        return host_offer(), False
    nvml = open_nvml_or_reason()
    if isinstance(nvml, str):
        return (None, True) if cfg.train.device == "cuda" else (host_offer(), False)
    try:
        cards = [(nvml.memory(i).total_mib, nvml.name(i)) for i in range(nvml.device_count())]
    except Exception:  # noqa: BLE001 - a card NVML cannot read: the GPU wait says so; no figure to judge by
        return None, True
    finally:
        nvml.close()
    if not cards:
        return None, True
    total_mib, name = max(cards)
    return Offer(total_mib * 1024 ** 2, f"GPU memory of the largest card here ({name})"), True


def _no_nvml() -> str:
    """Why NVML cannot start here (open_nvml_or_reason's sentence), "" when it can (then closed again)."""
    nvml = open_nvml_or_reason()
    if isinstance(nvml, str):
        return nvml
    nvml.close()
    return ""


def lease_name(index: int, uuid: str) -> str:
    """The lease file of device `index` (its UUID where NVML gives one) in gpu.lock_dir."""
    # Drivers before R470 named MIG instances "MIG-GPU-<uuid>/<gi>/<ci>": no "/" in a lock file's name.
    return f"gpu-{uuid.replace('/', '-') if uuid else f'index-{index}'}.lock"


def first_instance_index(cards: int, instances_before: int) -> int:
    """The device index of the first MIG instance of a card, after `instances_before` instances of the cards before
    it, among `cards` cards: a card keeps its NVML index, and MIG instances follow all cards, in card order. The one
    numbering of the wait (GpuAdmission.poll), the leases (lease_name) and `run --check` (gpuwaits)."""
    return cards + instances_before


def mig_refusal(report: PollReport, count: int) -> str | None:
    """Why a run asking for `count` devices can never be admitted on these cards, where MIG is the cause: more than
    one device, fewer whole cards than that, and MIG instances (or MIG cards) for the rest. None otherwise."""
    whole = [d for d in report.devices if not d.mig and d.mig_parent is None]
    mig = [d for d in report.devices if d.mig_parent is not None]
    if count > 1 and len(whole) < count and (mig or any(d.mig for d in report.devices)):
        return MIG_NO_DDP.format(count=count, whole=len(whole), mig=len(mig))
    return None


class GpuAdmission:
    """Polls NVML, keeps per-device stability counts, and leases free devices. Not thread-safe: one owner."""

    LEASED_BY = "leased by "
    """How lease_busy's words begin for a lease another run holds (a lost lease: daemon/host/leasekeep.py)."""

    def __init__(self, nvml: Nvml, gpu: GpuSection, own_pids=(), run_name: str = "", clock=time.time):
        self.nvml = nvml
        self.gpu = gpu
        self.own_pids = set(own_pids)
        """Pids of this run (its trainer children): never counted as foreign. Update it when the child changes."""
        self.run_name = run_name
        self.clock = clock
        self.lock_dir = Path(gpu.lock_dir)
        self._stable: dict[int, int] = {}
        self._state_since: dict[int, tuple[bool, float]] = {}
        self._leases: list[DeviceLease] = []
        self._fresh = False
        self.last_report: PollReport | None = None

    # --- polling -------------------------------------------------------------------------------------------------
    def poll(self) -> PollReport:
        now = self.clock()
        ours = {i for lease in self._leases for i in lease.devices}
        statuses, error = [], None
        try:
            count = self.nvml.device_count()
        except Exception as e:  # noqa: BLE001 - NVML errors (driver reload, GPU lost) must not end a days-long wait
            count, error = 0, f"{type(e).__name__}: {e}"
            self._stable.clear()
        instances: list[DeviceStatus] = []
        for i in range(count):
            try:
                card, mig = self._poll_card(i, now, i in ours, first_instance_index(count, len(instances)), ours)
                statuses.append(card)
                instances += mig
            except Exception as e:  # noqa: BLE001 - one lost device is busy, the others may still be free
                self._stable[i] = 0
                statuses.append(DeviceStatus(index=i, name="?", uuid="", free=False,
                                             reasons=[f"NVML query failed: {type(e).__name__}: {e}"], used_mib=-1,
                                             utilization=None, foreign_processes=[], stable_polls=0, since=now,
                                             leased_by_us=i in ours))
        statuses += instances
        self.last_report = PollReport(now, statuses, self.gpu.stable_polls, error)
        self._fresh = True
        return self.last_report

    def _poll_card(self, i: int, now: float, leased_by_us: bool, first: int,
                   ours: set[int]) -> tuple[DeviceStatus, list[DeviceStatus]]:
        """Card i, and where it is in MIG mode its instances as devices `first`, `first` + 1, ..."""
        if not self.nvml.mig_enabled(i):
            return self._poll_device(i, now, leased_by_us, device_uuid(self.nvml, i), self.nvml.name(i),
                                     self.nvml.memory(i), self.nvml.utilization(i), self.nvml.processes(i)), []
        get = getattr(self.nvml, "mig_instances", None)
        found = list(get(i)) if get else []
        instances = [self._poll_device(first + k, now, first + k in ours, m.uuid, m.name, m.memory, None,
                                       m.processes, mig_parent=i) for k, m in enumerate(found)]
        many = len(found) > 1
        reason = MIG_PARENT.format(n=len(found), s="s" if many else "", are="are" if many else "is",
                                   first=f"{first}-{first + len(found) - 1}" if many else first)
        if not found:
            reason = MIG_NO_INSTANCE
        self._stable[i] = 0
        prev = self._state_since.get(i)
        if prev is None or prev[0]:
            self._state_since[i] = (False, now)
        try:
            used = self.nvml.memory(i).used_mib
        except Exception:  # noqa: BLE001 - the card's own figure is only shown; its instances are what is leased
            used = -1
        card = DeviceStatus(index=i, name=self.nvml.name(i), uuid=device_uuid(self.nvml, i), free=False,
                            reasons=[reason], used_mib=used, utilization=None, foreign_processes=[], stable_polls=0,
                            since=self._state_since[i][1], mig=True)
        return card, instances

    def _poll_device(self, i: int, now: float, leased_by_us: bool, uuid: str, name: str, mem: MemoryReading,
                     util: int | None, listing: ProcessListing, mig_parent: int | None = None) -> DeviceStatus:
        procs = listing.processes or []
        foreign = [(pid, mib) for pid, mib in procs if pid not in self.own_pids]
        own = [(pid, mib) for pid, mib in procs if pid in self.own_pids]
        reasons, checks, fallbacks = [], [], []
        if foreign:
            listed = ", ".join(f"pid {pid} ({mib} MiB)" for pid, mib in foreign)
            reasons.append(f"{len(foreign)} foreign process{'es' if len(foreign) > 1 else ''}: {listed}")
        if listing.processes is not None:
            checks.append(f"{len(foreign)} foreign process{'' if len(foreign) == 1 else 'es'}"
                          + (f" ({len(own)} of this run)" if own else ""))
        limit = self.gpu.max_used_mib + mem.allowance_mib
        allowed = (f"{self.gpu.max_used_mib}" if not mem.allowance_mib else
                   f"{self.gpu.max_used_mib} + {mem.allowance_mib} (v1 counts the driver's reserve)")
        checks.append(f"used {mem.used_mib} MiB {'<=' if mem.used_mib <= limit else '>'} {allowed}")
        if mem.used_mib > limit:
            reasons.append(f"{mem.used_mib} MiB used > {allowed} MiB allowed")
        if util is None:
            checks.append("utilisation not reported per MIG instance" if mig_parent is not None
                          else "utilisation not reported")
        else:
            checks.append(f"utilisation {util}% {'<=' if util <= self.gpu.max_utilization else '>'} "
                          f"{self.gpu.max_utilization}%")
            if util > self.gpu.max_utilization:
                reasons.append(f"utilisation {util}% > {self.gpu.max_utilization}%")
        if mem.source != "v2":
            fallbacks.append(f"memory {mem.source}: {mem.note}; used judged against gpu.max_used_mib + "
                             f"{mem.allowance_mib} MiB for the driver's reserve")
        if listing.processes is None:
            fallbacks.append(f"no compute-process listing ({listing.note}): admission by memory and "
                             f"utilisation alone")
        elif listing.source != "v3":
            fallbacks.append(f"compute processes listed with {listing.source} ({listing.note})")
        if not leased_by_us:
            busy = self.lease_busy(lease_name(i, uuid))
            if busy is not None:
                reasons.append(busy)
        free = not reasons
        self._stable[i] = self._stable.get(i, 0) + 1 if free else 0
        prev = self._state_since.get(i)
        if prev is None or prev[0] != free:
            self._state_since[i] = (free, now)
        return DeviceStatus(index=i, name=name, uuid=uuid, free=free, reasons=reasons,
                            used_mib=mem.used_mib, utilization=util, foreign_processes=foreign,
                            stable_polls=self._stable[i], since=self._state_since[i][1], leased_by_us=leased_by_us,
                            checks=checks, fallbacks=fallbacks, own_processes=own, mig_parent=mig_parent,
                            allowed_mib=limit)

    # --- leasing -------------------------------------------------------------------------------------------------
    def try_acquire(self, count: int) -> DeviceLease | None:
        """Lease `count` devices that have been free for stable_polls polls, all or none. One call is one poll
        unless poll() was called since the last try_acquire (so calling both per interval counts once)."""
        report = self.last_report if self._fresh and self.last_report else self.poll()
        self._fresh = False
        candidates = [d for d in report.devices
                      if not d.leased_by_us and d.free and d.stable_polls >= report.stable_polls_needed
                      and (count == 1 or d.mig_parent is None)]  # DDP cannot span MIG instances
        if len(candidates) < count:
            return None
        taken: list[tuple[DeviceStatus, LeaseFile]] = []
        for d in candidates:
            lease_file = self.take_name(lease_name(d.index, d.uuid))
            if lease_file is None:
                # Another run took it between our poll and now: it is busy, and its stability starts over.
                self._stable[d.index] = 0
                self._state_since[d.index] = (False, report.time)
                continue
            taken.append((d, lease_file))
            if len(taken) == count:
                break
        if len(taken) < count:
            for _, lease_file in taken:
                lease_file.close()
            return None
        lease = DeviceLease([d.index for d, _ in taken], [d.uuid for d, _ in taken], [f for _, f in taken],
                            self._forget)
        self._leases.append(lease)
        return lease

    def keep(self, lease: DeviceLease) -> list[Said]:
        """The lease kept valid while it is held (daemon/host/leasekeep.py: what each keep found, and its kind)."""
        return leasekeep.keep(self, lease._files, lease.devices)

    def _forget(self, lease: DeviceLease) -> None:
        if lease in self._leases:
            self._leases.remove(lease)
        for i in lease.devices:
            self._stable[i] = 0

    def lease_busy(self, name: str) -> str | None:
        """Why this device's lease (its file `name`) cannot be ours now ("leased by run X pid Y", or why its file
        is not safe to use: leases.unfit's words), or None when we could take it."""
        try:
            lease = leases.open_lease(self.lock_dir, name)
        except leases.LeaseUnsafe as e:
            return f"lease not taken safely: {e}"
        except OSError as e:
            return f"lease not taken: {self.lock_dir}: {e.strerror or e}"
        try:
            if not leases.try_lock(lease, exclusive=False):
                return f"{self.LEASED_BY}{leases.describe_holder(lease)}"
            leases.unlock(lease)
            return None
        finally:
            lease.close()

    def take_name(self, name: str) -> LeaseFile | None:
        try:
            lease = leases.take(self.lock_dir, name)
        except (leases.LeaseUnsafe, OSError):
            return None  # the next poll says why (lease_busy opens it the same way)
        if lease is None:
            return None
        try:
            leases.write_body(lease, leases.lease_body(self.run_name, socket.gethostname()))
        except OSError:
            pass  # the lease holds (the flock); only its description is missing
        return lease


def device_uuid(nvml: Nvml, i: int) -> str:
    """Device i's UUID as NVML gives it ("" where it gives none: its index names its lease then)."""
    get = getattr(nvml, "uuid", None)
    try:
        return str(get(i)) if get else ""
    except Exception:  # noqa: BLE001 - an NVML error on one query must not stop the wait; the index is a fine key
        return ""
