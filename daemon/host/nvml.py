"""NVML as admission reads it: the version of each query this driver answers, and what a fallback costs.

Three queries have versions whose differences decide whether an idle card looks idle:
- memory: `nvmlDeviceGetMemoryInfo(handle)` without a version is the v1 struct, whose `used` includes what the
  driver reserves for itself (~900 MiB on an idle A100, where v2 says ~8). v2 (`pynvml.nvmlMemory_v2`, drivers
  >= R510, every H100/H200 driver) is asked first. Where the binding or the driver lacks it, v1 is used and judged
  against `gpu.max_used_mib` plus an allowance for the driver's reserve (`v1_reserve_allowance_mib`).
- processes: the unversioned call is v3 wrapped in pynvml's `throwOnVersionMismatch`, which turns a driver without
  the v3 symbol into `NVMLLibraryMismatchError` (not an `NVMLError`). v3 is asked by name, then v2; where neither
  answers, admission goes by memory alone and says so.
- MIG mode: a MIG-enabled card is refused (daemon/host/gpu.py says why), so it is read here.
Which versions answered is remembered per backend and stated in every reading (`MemoryReading.source`,
`ProcessListing.source`, `.note`), so that `minilmd status` shows the fallback taken. Torch-free; `pynvml` is passed
in (the real module, or the real module over tests/fakes_nvml.py's fake library).
"""
from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
V1_RESERVE_FRACTION = 0.02
"""With only v1 memory, this share of the card's total (at least V1_RESERVE_MIN_MIB) is taken as the driver's own
reserve: v1 `used` of an idle card is that reserve (~912 MiB of 40 GiB on an A100: 2.2 %; v2 shows 8 MiB)."""
V1_RESERVE_MIN_MIB = 1024


def v1_reserve_allowance_mib(total_mib: int) -> int:
    """What an idle card's v1 `used` may show on top of gpu.max_used_mib: the driver's reserve, which v2 reports
    apart and v1 counts as used. A job worth avoiding uses gigabytes, and its process is listed anyway."""
    return max(V1_RESERVE_MIN_MIB, int(total_mib * V1_RESERVE_FRACTION))


@dataclass(frozen=True)
class MemoryReading:
    used_mib: int
    total_mib: int
    source: str
    """"v2" (used without the driver's reserve) or "v1" (used includes it)."""
    allowance_mib: int = 0
    """Added to gpu.max_used_mib when judging `used_mib`: the v1 reserve allowance, 0 for v2."""
    note: str = ""
    """Why v2 was not used, when it was not."""


@dataclass(frozen=True)
class ProcessListing:
    processes: list[tuple[int, int]] | None
    """(pid, used MiB) of every compute process; None when no listing call works (admission by memory alone)."""
    source: str
    """"v3", "v2", or "none"."""
    note: str = ""
    """Why a later version was not used, when it was not."""


def _missing(nv, e: BaseException) -> bool:
    """Whether an error means "this binding or driver has no such call" (so an older version may answer), rather
    than a failure of the card (which must make the card busy)."""
    if isinstance(e, (AttributeError, nv.NVMLLibraryMismatchError)):
        return True
    kinds = tuple(getattr(nv, n) for n in ("NVMLError_FunctionNotFound", "NVMLError_NotSupported",
                                           "NVMLError_ArgumentVersionMismatch") if hasattr(nv, n))
    return isinstance(e, kinds)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class PynvmlBackend:
    """daemon/host/gpu.py's `Nvml` over nvidia-ml-py. Device handles are looked up by index on every call: cheap, and
    robust against a device that disappears and comes back."""

    def __init__(self, pynvml_module):
        self._nv = pynvml_module
        self._memory_v2: str | None = None
        """Why v2 memory is not available (set on the first failure that says the call is missing), else None."""
        self._proc_versions = ["v3", "v2"]
        self._proc_notes: list[str] = []

    def _h(self, i: int):
        return self._nv.nvmlDeviceGetHandleByIndex(i)

    def device_count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def name(self, i: int) -> str:
        n = self._nv.nvmlDeviceGetName(self._h(i))
        return n.decode() if isinstance(n, bytes) else str(n)

    def uuid(self, i: int) -> str:
        u = self._nv.nvmlDeviceGetUUID(self._h(i))
        return u.decode() if isinstance(u, bytes) else str(u)

    # --- memory ---------------------------------------------------------------------------------------------------
    def memory(self, i: int) -> MemoryReading:
        """v2 where the binding and the driver have it, else v1 with the reserve allowance."""
        nv, h = self._nv, self._h(i)
        if self._memory_v2 is None:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                return MemoryReading(int(m.used // MIB), int(m.total // MIB), "v2")
            except Exception as e:
                if not _missing(nv, e):
                    raise
                self._memory_v2 = f"no v2 memory query ({_describe(e)})"
        m = nv.nvmlDeviceGetMemoryInfo(h)
        total = int(m.total // MIB)
        return MemoryReading(int(m.used // MIB), total, "v1", v1_reserve_allowance_mib(total), self._memory_v2)

    def memory_v1_v2(self, i: int) -> tuple[int | None, int | None]:
        """(v1 used MiB, v2 used MiB), None where that version does not answer: for scripts/gpu-check."""
        nv, h = self._nv, self._h(i)
        v1 = v2 = None
        try:
            v1 = int(nv.nvmlDeviceGetMemoryInfo(h).used // MIB)
        except Exception:  # noqa: BLE001 - a report of what answers
            pass
        try:
            v2 = int(nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used // MIB)
        except Exception:  # noqa: BLE001 - a report of what answers
            pass
        return v1, v2

    # --- processes ------------------------------------------------------------------------------------------------
    def processes(self, i: int) -> ProcessListing:
        """v3, then v2 by name (never the unversioned call: it raises NVMLLibraryMismatchError on older drivers);
        a version that is missing is not asked again."""
        nv, h = self._nv, self._h(i)
        while self._proc_versions:
            version = self._proc_versions[0]
            try:
                procs = getattr(nv, f"nvmlDeviceGetComputeRunningProcesses_{version}")(h)
            except Exception as e:
                if not _missing(nv, e):
                    raise
                self._proc_notes.append(f"{version}: {_describe(e)}")
                self._proc_versions.pop(0)
                continue
            # usedGpuMemory is None where the driver hides it (containers without the pid namespace of the host).
            listed = [(int(p.pid), int((p.usedGpuMemory or 0) // MIB)) for p in procs]
            return ProcessListing(listed, version, "; ".join(self._proc_notes))
        return ProcessListing(None, "none", "; ".join(self._proc_notes))

    # --- the rest -------------------------------------------------------------------------------------------------
    def utilization(self, i: int) -> int | None:
        try:
            return int(self._nv.nvmlDeviceGetUtilizationRates(self._h(i)).gpu)
        except self._nv.NVMLError_NotSupported:
            return None

    def mig_enabled(self, i: int) -> bool:
        """Whether MIG mode is on now (the pending mode counts after a reset only). A card or driver without MIG
        says False."""
        nv = self._nv
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(self._h(i))
        except Exception as e:
            if _missing(nv, e):
                return False
            raise
        return current == nv.NVML_DEVICE_MIG_ENABLE

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError:
            pass


def open_nvml_or_reason() -> PynvmlBackend | str:
    """The NVML backend, or a sentence saying why there is none (no library, no driver, no device)."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return "no NVIDIA driver: the NVML library (libnvidia-ml.so.1) was not found"
    except pynvml.NVMLError_DriverNotLoaded:
        return "the NVIDIA driver is not loaded"
    except pynvml.NVMLError as e:
        return f"NVML failed to start: {e}"
    return PynvmlBackend(pynvml)
