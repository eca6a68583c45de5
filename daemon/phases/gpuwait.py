"""The supervisor's side of GPU admission: the waiting_gpu phase's polling until `gpu.count` cards look free, the
lease it then takes, and after a CUDA OOM whether a foreign process sits on our cards.

NVML, the free-card rule and the lease files shared by every run on the machine are daemon/host/gpu.py, reached through
`Infra.open_gpu`. `GpuWaiter.tick()` is called by the loop in the waiting_gpu phase and answers None while it waits,
`GpuReady` once the trainer may use a card (or the CPU), or `GpuUnavailable` when train.device = "cuda" and there is
no NVML, when every card is in MIG mode without an instance, or when gpu.count > 1 cannot be met without MIG
instances (daemon/host/gpu.py `mig_refusal`). The processes of this run's
trainer
(`own_pids()`, from trainer.json through daemon/child/orphans.py) are never foreign: after a CUDA OOM, `gpu_taken()`
judges "the GPU was taken" from foreign processes and from memory our own processes do not account for. While the
run holds its cards, `keep_lease()` (the supervisor's every tick) keeps each lease file touched and named; `lost`
says a card's lease another run holds now, which the supervisor does not share (daemon/attempt.py _leave_lost_gpu).
Torch-free.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from minilmd import protocol
from minilmd.daemon.base.runstate import RunState, now
from minilmd.daemon.base.statesections import GpuWait
from minilmd.daemon.host.gpu import DeviceLease, GpuAdmission, cuda_visible_devices, mig_refusal, taken_from_us
from minilmd.daemon.host.leasekeep import Kept
from minilmd.fmt import fmt_duration

LEASE_KEPT_EVERY_S = 5.0
"""The longest a held lease goes unkept (keep_lease), whatever gpu.poll_interval. Once a cleaner removed its file,
the next run to see the card free leases it after its own gpu.stable_polls free polls (3 x 30 s by default, as
short as one poll of its own config): a holder that kept its lease only every gpu.poll_interval of its own (a "5m"
one) lost that race, and two runs held the card. A keep is a walk to the lock directory, a stat and a futimens."""


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

    def __init__(self, cfg, infra, state: RunState, emit, own_pids=lambda: ()):
        self.cfg = cfg
        self.own_pids = own_pids
        """() -> the pids of this run's trainer processes now (a torchrun group: torchrun and its ranks)."""
        self.fallbacks_said: set[str] = set()
        self.infra = infra
        self.state = state
        self.emit = emit
        self.admission: GpuAdmission | None = None
        self.lease: DeviceLease | None = None
        self.devices_env = ""
        """CUDA_VISIBLE_DEVICES for the trainer: the leased cards, or "" on the CPU."""
        self.next_poll_at = 0.0
        self.last_summary = ""
        self.next_keep_at = 0.0
        self.lost_said: set[str] = set()
        """The words of a keep already said (keep_lease): each said once, until a keep finds every name ours again."""
        self.lost = ""
        """A card's lease lost to another run, found so by two keeps in a row (its words; "" while none is): by the
        admission's own rule (its lease part) this run would not be admitted to that card now, so it must not train
        there (the supervisor stops its trainer at a checkpoint and waits for a free GPU again: daemon/attempt.py
        _leave_lost_gpu). Two keeps: a run that tries to lease several cards at once lets go at once of those it took
        when it cannot take them all, and a keep may find it holding one for that moment."""
        self._lost_once = False

    @property
    def nproc(self) -> int:
        """Trainer processes to launch: one per leased card (cfg.world_size, as the plan counts), one on the CPU."""
        return self.cfg.world_size if self.lease is not None else 1

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
            self.state.gpu_wait = GpuWait(since=now(), devices=[])
        if now() < self.next_poll_at:
            return None
        self.next_poll_at = now() + self.cfg.gpu.poll_interval_s
        report = self._poll()
        if report.devices and all(d.mig for d in report.devices):
            return GpuUnavailable("every GPU NVML sees is in MIG mode: " + report.devices[0].reasons[0]
                                  + '; or set train.device = "cpu"')
        refused = mig_refusal(report, self.cfg.gpu.count)
        if refused:
            return GpuUnavailable(refused + '; or set train.device = "cpu"')
        assert self.state.gpu_wait is not None  # set when the admission opened
        self.state.gpu_wait.devices = report.to_dict()["devices"]
        summary = report.summary()
        if summary != self.last_summary and _without_ages(summary) != _without_ages(self.last_summary):
            self.emit("gpu", "waiting for a GPU:\n  " + summary.replace("\n", "\n  "))
        self.last_summary = summary
        lease = self.admission.try_acquire(self.cfg.gpu.count)
        if lease is None:
            return None
        self.lease = lease
        self.devices_env = cuda_visible_devices(lease)
        self.state.devices = list(lease.devices)
        waited = now() - (self.state.gpu_wait.since or now())  # the wait began with the admission
        self.state.gpu_wait = None
        checked = "; ".join(f"GPU {d.index}: {', '.join(d.checks)}" for d in report.devices
                            if d.index in lease.devices)
        return GpuReady(f"leased GPU(s) {lease.devices} after waiting {fmt_duration(waited)} ({checked})",
                        list(lease.devices))

    def keep_lease(self) -> None:
        """While the run holds its cards (staging, training, a backoff between trainers: until release), every
        gpu.poll_interval or LEASE_KEPT_EVERY_S, the shorter, from the first tick after the lease: GpuAdmission.keep,
        each lease file touched and still named, or its name taken again (daemon/host/leasekeep.py's kinds). A name
        taken again is said in a `gpu` event; one another run holds now (a lost lease: two runs may share the card),
        or one not taken again, in a `gpu` event and as the run's last error, which `status` shows; a name that could
        not be looked at in a `gpu` event only (looked at again at the next keep); each once until it changes."""
        if self.lease is None or self.admission is None or now() < self.next_keep_at:
            return
        self.next_keep_at = now() + min(self.cfg.gpu.poll_interval_s, LEASE_KEPT_EVERY_S)
        kept = self.admission.keep(self.lease)
        if not kept:
            self.lost_said.clear()  # every name seen and ours: whatever comes next is news
        lost = [said.words for said in kept if said.kind == Kept.LOST]
        self.lost = "; ".join(lost) if lost and self._lost_once else ""
        self._lost_once = bool(lost)
        for said in kept:
            if said.words in self.lost_said:
                continue
            self.emit("gpu", said.words)
            if said.kind == Kept.AGAIN:
                self.lost_said.clear()
                continue
            self.lost_said.add(said.words)
            if said.kind != Kept.UNSEEN:
                self.state.record_error(said.words)

    def _poll(self):
        """One admission poll with this run's processes as own; each new fallback is said once."""
        assert self.admission is not None  # tick() opened it
        self.admission.own_pids = set(self.own_pids())
        report = self.admission.poll()
        for d in report.devices:
            for fallback in d.fallbacks:
                if fallback not in self.fallbacks_said:
                    self.fallbacks_said.add(fallback)
                    self.emit("gpu", f"GPU {d.index}: NVML fallback: {fallback}")
        return report

    def gpu_taken(self) -> tuple[bool, str] | None:
        """After a CUDA OOM: (whether the GPU was taken from us, why), or None without a lease. Taken when a
        foreign process sits on one of our cards, or when more memory is used there than gpu.max_used_mib (plus
        the v1 reserve allowance) beyond what our own processes still hold (a process NVML does not list, e.g.
        of another container, or no listing at all)."""
        if self.admission is None or self.lease is None:
            return None
        report = self._poll()
        why = [reason for d in report.devices if d.index in self.lease.devices
               and (reason := taken_from_us(d)) is not None]
        if why:
            return True, "; ".join(why)
        return False, "; ".join(f"GPU {d.index}: {', '.join(d.checks)}" for d in report.devices
                                if d.index in self.lease.devices)

    def release(self) -> None:
        """Give the cards back; the next waiting_gpu phase opens NVML again and waits for free cards."""
        if self.lease is not None:
            self.lease.release()
        self.lease = None
        self.admission = None
        self.next_keep_at, self.lost_said, self.lost, self._lost_once = 0.0, set(), "", False


def _without_ages(summary: str) -> str:
    """A GPU summary without its durations, to log a change of who is busy rather than every poll."""
    return re.sub(r"\(\d+[smh]\S*\)|for \d+\S*", "", summary)
