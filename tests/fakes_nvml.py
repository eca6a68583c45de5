"""A scriptable stand-in for NVML, for tests of GPU admission (and of the supervisor's waiting_gpu state).

Each device gets a script: a list of `GpuState`, one per poll; the last state repeats forever. A poll starts with
`device_count()` (GpuAdmission calls it once per poll), so the fake knows which entry of each script to answer
with. States can also be changed on the fly with `set(i, state)` (it then holds until the next `set`).

    nvml = FakeNvml([[busy(used_mib=49500, procs=[(4242, 49500)]), FREE], [FREE]])
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuState:
    used_mib: int = 0
    utilization: int | None = 0
    processes: tuple[tuple[int, int], ...] = ()
    """(pid, MiB) of compute processes."""


FREE = GpuState()


def busy(used_mib: int = 0, utilization: int | None = 0, procs=()) -> GpuState:
    return GpuState(used_mib, utilization, tuple((int(p), int(m)) for p, m in procs))


@dataclass
class FakeNvml:
    scripts: list[list[GpuState]]
    names: list[str] | None = None
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

    def memory_used_mib(self, i: int) -> int:
        return self.state(i).used_mib

    def utilization(self, i: int) -> int | None:
        return self.state(i).utilization

    def compute_processes(self, i: int) -> list[tuple[int, int]]:
        return list(self.state(i).processes)
