"""The supervisor's side of GPU admission: the waiting_gpu phase's polling until `gpu.count` cards look free, the
lease it then takes, and after a CUDA OOM whether a foreign process sits on our cards.

NVML, the free-card rule and the lease files shared by every run on the machine are daemon/gpu.py, reached through
`Infra.open_gpu`. `GpuWaiter.tick()` is called by the loop in the waiting_gpu phase and answers None while it waits,
`GpuReady` once the trainer may use a card (or the CPU), or `GpuUnavailable` when train.device = "cuda" and there is
no NVML. Torch-free.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from minilmd import protocol
from minilmd.config import parse_duration
from minilmd.daemon.runstate import now
from minilmd.fmt import fmt_duration


@dataclass
class GpuReady:
    reason: str
    devices: list[int]
    """The leased card indices; [] when training on the CPU."""


@dataclass
class GpuUnavailable:
    error: str
    exit_status: int = protocol.SUPERVISOR_CONFIG


class GpuWaiter:
    """Owns the GpuAdmission, the lease and the poll timing. `state` is the run's RunState (its "gpu_wait" and
    "devices" entries are written here), `emit(kind, message, **details)` logs an event."""

    def __init__(self, cfg, infra, state, emit):
        self.cfg = cfg
        self.infra = infra
        self.state = state
        self.emit = emit
        self.admission = None
        self.lease = None
        self.devices_env = ""
        """CUDA_VISIBLE_DEVICES for the trainer: the leased cards, or "" on the CPU."""
        self.next_poll_at = 0.0
        self.last_summary = ""

    @property
    def nproc(self) -> int:
        """Trainer processes to launch: one per leased card, one on the CPU."""
        return self.cfg.gpu.count if self.lease is not None else 1

    def tick(self) -> GpuReady | GpuUnavailable | None:
        device = self.cfg.train.device
        if device == "cpu":
            self.devices_env = ""
            return GpuReady("train.device = cpu: no GPU needed", [])
        if self.admission is None:
            admission = self.infra.open_gpu(self.cfg)
            if isinstance(admission, str):
                if device == "cuda":
                    return GpuUnavailable(f"train.device = cuda, but {admission}")
                self.devices_env = ""
                return GpuReady(f"{admission}: training on the CPU (train.device = auto)", [])
            self.admission = admission
            self.state["gpu_wait"] = {"since": now(), "devices": []}
        if now() < self.next_poll_at:
            return None
        self.next_poll_at = now() + parse_duration(self.cfg.gpu.poll_interval)
        report = self.admission.poll()
        self.state["gpu_wait"]["devices"] = report.to_dict()["devices"]
        summary = report.summary()
        if summary != self.last_summary and _without_ages(summary) != _without_ages(self.last_summary):
            self.emit("gpu", "waiting for a GPU:\n  " + summary.replace("\n", "\n  "))
        self.last_summary = summary
        lease = self.admission.try_acquire(self.cfg.gpu.count)
        if lease is None:
            return None
        from minilmd.daemon.gpu import cuda_visible_devices

        self.lease = lease
        self.devices_env = cuda_visible_devices(lease)
        self.state["devices"] = list(lease.devices)
        waited = now() - self.state["gpu_wait"]["since"]
        self.state["gpu_wait"] = None
        return GpuReady(f"leased GPU(s) {lease.devices} after waiting {fmt_duration(waited)}", list(lease.devices))

    def foreign_on_ours(self) -> bool | None:
        """Whether another process uses one of our leased cards now (a CUDA OOM that is not our fault); None
        without a lease."""
        if self.admission is None or self.lease is None:
            return None
        report = self.admission.poll()
        ours = set(self.lease.devices)
        return any(d.index in ours and d.foreign_processes for d in report.devices)

    def release(self) -> None:
        """Give the cards back; the next waiting_gpu phase opens NVML again and waits for free cards."""
        if self.lease is not None:
            self.lease.release()
        self.lease = None
        self.admission = None


def _without_ages(summary: str) -> str:
    """A GPU summary without its durations, to log a change of who is busy rather than every poll."""
    return re.sub(r"\(\d+[smh]\S*\)|for \d+\S*", "", summary)
