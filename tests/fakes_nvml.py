"""A scriptable stand-in for NVML, for tests of GPU admission (and of the supervisor's waiting_gpu state).

Each device gets a script: a list of `GpuState`, one per poll; the last state repeats forever. A poll starts with
`device_count()` (GpuAdmission calls it once per poll), so the fake knows which entry of each script to answer
with. States can also be changed on the fly with `set(i, state)` (it then holds until the next `set`).

    nvml = FakeNvml([[busy(used_mib=49500, procs=[(4242, 49500)]), FREE], [FREE]])

`FakeNvmlLib` goes one level lower: a stand-in for libnvidia-ml.so itself under the real pynvml module (its ctypes
wrappers, version arguments, error classes and `throwOnVersionMismatch`), answering from a FakeNvml's states like a
driver of a chosen age would: with or without `nvmlDeviceGetMemoryInfo_v2` (v1 `used` then includes the driver's
reserve), with or without the v3 / v2 process listings, MIG mode on or off, and a MIG card's instances behind MIG
device handles (`GpuState.mig_instances`: each `MigState` has its own memory and processes). `with
FakeNvmlLib(...).installed() as nv:` gives the pynvml module to build a `PynvmlBackend` on.
"""
from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass, field

from minilmd.daemon.host.nvml import MemoryReading, MigInstance, ProcessListing

MIB = 1024 * 1024


@dataclass(frozen=True)
class MigState:
    """One MIG instance of a card in MIG mode (an H200's 1g.18gb slice by default)."""

    used_mib: int = 0
    processes: tuple[tuple[int, int], ...] = ()
    total_mib: int = 16384
    profile: str = "1g.18gb"


def mig(used_mib: int = 0, procs=(), total_mib: int = 16384, profile: str = "1g.18gb") -> MigState:
    return MigState(used_mib, tuple((int(p), int(m)) for p, m in procs), total_mib, profile)


@dataclass(frozen=True)
class GpuState:
    used_mib: int = 0
    utilization: int | None = 0
    processes: tuple[tuple[int, int], ...] = ()
    """(pid, MiB) of compute processes."""
    mig: bool = False
    """MIG mode enabled."""
    mig_instances: tuple[MigState, ...] = ()
    """The MIG instances configured on a card in MIG mode."""


FREE = GpuState()


def busy(used_mib: int = 0, utilization: int | None = 0, procs=(), mig: bool = False, instances=()) -> GpuState:
    return GpuState(used_mib, utilization, tuple((int(p), int(m)) for p, m in procs), mig or bool(instances),
                    tuple(instances))


@dataclass
class FakeNvml:
    scripts: list[list[GpuState]]
    names: list[str] | None = None
    total_mib: int = 143771
    """Each card's memory (an H200's, as NVML reports it)."""
    polls: int = 0
    """Number of polls started so far (calls of device_count())."""
    calls: list[str] = field(default_factory=list)
    _override: dict[int, GpuState] = field(default_factory=dict)

    def device_count(self) -> int:
        self.polls += 1
        self.calls.append("device_count")
        return len(self.scripts)

    def set(self, i: int, state: GpuState) -> None:
        self._override[i] = state

    def state(self, i: int) -> GpuState:
        if i in self._override:
            return self._override[i]
        script = self.scripts[i]
        return script[min(max(self.polls - 1, 0), len(script) - 1)]

    def name(self, i: int) -> str:
        return self.names[i] if self.names else f"Fake GPU {i}"

    def uuid(self, i: int) -> str:
        return f"GPU-fake-{i:04d}"

    def memory(self, i: int) -> MemoryReading:
        return MemoryReading(self.state(i).used_mib, self.total_mib, "v2")

    def utilization(self, i: int) -> int | None:
        return self.state(i).utilization

    def processes(self, i: int) -> ProcessListing:
        return ProcessListing(list(self.state(i).processes), "v3")

    def mig_enabled(self, i: int) -> bool:
        return self.state(i).mig

    def mig_uuid(self, i: int, k: int) -> str:
        return f"MIG-fake-{i:04d}-{k}"

    def mig_name(self, i: int, k: int) -> str:
        return f"{self.name(i)} MIG {self.state(i).mig_instances[k].profile}"

    def mig_instances(self, i: int) -> list[MigInstance]:
        return [MigInstance(k, self.mig_uuid(i, k), self.mig_name(i, k), MemoryReading(m.used_mib, m.total_mib, "v2"),
                            ProcessListing(list(m.processes), "v3"))
                for k, m in enumerate(self.state(i).mig_instances)]


NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND, NVML_ERROR_INSUFFICIENT_SIZE = 0, 3, 6, 7
MIG_HANDLE = 1000
"""A MIG device handle of the fake is (card + 1) * MIG_HANDLE + instance + 1; a card's is card + 1."""


@dataclass
class FakeNvmlLib:
    """libnvidia-ml.so as a driver of a given age answers it, over a FakeNvml's scripted states. Attributes that a
    real library of that age lacks are absent (pynvml's `_nvmlGetFunctionPointer` raises FunctionNotFound)."""

    nvml: FakeNvml
    memory_v2: bool = True
    """Whether nvmlDeviceGetMemoryInfo_v2 exists (drivers >= R510)."""
    reserved_mib: int = 900
    """What the driver keeps for itself: in v1 `used`, in v2 `reserved`."""
    listings: tuple[str, ...] = ("v3", "v2")
    """Which of nvmlDeviceGetComputeRunningProcesses_v3 / _v2 exist."""
    mig_supported: bool = True
    calls: list[str] = field(default_factory=list)

    def __getattr__(self, name: str):
        fn = _LIB_FUNCTIONS.get(name)
        if fn is None or not fn[1](self):
            raise AttributeError(name)
        self.calls.append(name)
        return lambda *args: fn[0](self, *args)

    def index(self, handle) -> int:
        """The card of a handle (of the card itself or of one of its MIG instances)."""
        value = int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
        return (value // MIG_HANDLE if value >= MIG_HANDLE else value) - 1

    def instance(self, handle) -> int | None:
        """The MIG instance a MIG device handle stands for; None for a card's handle."""
        value = int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
        return value % MIG_HANDLE - 1 if value >= MIG_HANDLE else None

    def reading(self, handle) -> tuple[int, tuple[tuple[int, int], ...], int]:
        """(used MiB, processes, total MiB) of the card or MIG instance behind a handle."""
        i, k = self.index(handle), self.instance(handle)
        if k is None:
            state = self.nvml.state(i)
            return state.used_mib, state.processes, self.nvml.total_mib
        m = self.nvml.state(i).mig_instances[k]
        return m.used_mib, m.processes, m.total_mib

    @contextlib.contextmanager
    def installed(self):
        """The real pynvml module with this library loaded in place of libnvidia-ml.so (and restored after)."""
        import pynvml

        saved = pynvml.nvmlLib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml.nvmlLib = self
        try:
            yield pynvml
        finally:
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml.nvmlLib = saved


def _out(ref):
    """The ctypes object a byref() argument points at."""
    return ref._obj


def _lib_count(lib, count_ref):
    _out(count_ref).value = lib.nvml.device_count()
    return NVML_SUCCESS


def _lib_handle(lib, index, device_ref):
    ptr = _out(device_ref)
    ctypes.memmove(ctypes.addressof(ptr), ctypes.byref(ctypes.c_void_p(index.value + 1)), ctypes.sizeof(ptr))
    return NVML_SUCCESS


def _lib_string(value_of, mig_value_of):
    def fn(lib, handle, buf, size):
        i, k = lib.index(handle), lib.instance(handle)
        buf.value = (value_of(lib, i) if k is None else mig_value_of(lib, i, k)).encode()[: size.value - 1]
        return NVML_SUCCESS
    return fn


def _lib_max_mig(lib, handle, count_ref):
    _out(count_ref).value = 7 if lib.nvml.state(lib.index(handle)).mig else 0  # an H200 holds up to 7 instances
    return NVML_SUCCESS


def _lib_mig_handle(lib, handle, index, device_ref):
    i = lib.index(handle)
    if index.value >= len(lib.nvml.state(i).mig_instances):
        return NVML_ERROR_NOT_FOUND
    ptr = _out(device_ref)
    value = ctypes.c_void_p((i + 1) * MIG_HANDLE + index.value + 1)
    ctypes.memmove(ctypes.addressof(ptr), ctypes.byref(value), ctypes.sizeof(ptr))
    return NVML_SUCCESS


def _lib_memory(version: int):
    def fn(lib, handle, mem_ref):
        used_mib, _, total_mib = lib.reading(handle)
        m, total, used = _out(mem_ref), total_mib * MIB, used_mib * MIB
        if version == 1:
            m.used = used + lib.reserved_mib * MIB
        else:
            import pynvml

            if m.version != pynvml.nvmlMemory_v2:
                return 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
            m.used, m.reserved = used, lib.reserved_mib * MIB
        m.total, m.free = total, total - m.used
        return NVML_SUCCESS
    return fn


def _lib_processes(lib, handle, count_ref, procs):
    listed = lib.reading(handle)[1]
    count = _out(count_ref)
    if procs is None or count.value < len(listed):
        count.value = len(listed)
        return NVML_SUCCESS if not listed else NVML_ERROR_INSUFFICIENT_SIZE
    for k, (pid, mib) in enumerate(listed):
        procs[k].pid, procs[k].usedGpuMemory = pid, mib * MIB
    count.value = len(listed)
    return NVML_SUCCESS


def _lib_utilization(lib, handle, util_ref):
    if lib.instance(handle) is not None:
        return NVML_ERROR_NOT_SUPPORTED  # NVML reports no utilisation per MIG instance
    value = lib.nvml.state(lib.index(handle)).utilization
    if value is None:
        return NVML_ERROR_NOT_SUPPORTED
    _out(util_ref).gpu = value
    return NVML_SUCCESS


def _lib_mig_mode(lib, handle, current_ref, pending_ref):
    if not lib.mig_supported:
        return NVML_ERROR_NOT_SUPPORTED
    mig = int(lib.nvml.state(lib.index(handle)).mig)
    _out(current_ref).value, _out(pending_ref).value = mig, mig
    return NVML_SUCCESS


def _always(lib) -> bool:
    return True


_LIB_FUNCTIONS = {
    "nvmlDeviceGetCount_v2": (_lib_count, _always),
    "nvmlDeviceGetHandleByIndex_v2": (_lib_handle, _always),
    "nvmlDeviceGetName": (_lib_string(lambda lib, i: lib.nvml.name(i), lambda lib, i, k: lib.nvml.mig_name(i, k)),
                          _always),
    "nvmlDeviceGetUUID": (_lib_string(lambda lib, i: lib.nvml.uuid(i), lambda lib, i, k: lib.nvml.mig_uuid(i, k)),
                          _always),
    "nvmlDeviceGetMaxMigDeviceCount": (_lib_max_mig, _always),
    "nvmlDeviceGetMigDeviceHandleByIndex": (_lib_mig_handle, _always),
    "nvmlDeviceGetMemoryInfo": (_lib_memory(1), _always),
    "nvmlDeviceGetMemoryInfo_v2": (_lib_memory(2), lambda lib: lib.memory_v2),
    "nvmlDeviceGetComputeRunningProcesses_v3": (_lib_processes, lambda lib: "v3" in lib.listings),
    "nvmlDeviceGetComputeRunningProcesses_v2": (_lib_processes, lambda lib: "v2" in lib.listings),
    "nvmlDeviceGetUtilizationRates": (_lib_utilization, _always),
    "nvmlDeviceGetMigMode": (_lib_mig_mode, _always),
    "nvmlShutdown": (lambda lib: NVML_SUCCESS, _always),
}
