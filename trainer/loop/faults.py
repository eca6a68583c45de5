"""Fault injection for tests and demos: MINILMD_FAULT="kind@step[,kind@step...]".

Each fault fires once per run, just before optimizer step `step` runs: it is appended to <run dir>/faults-fired
BEFORE it fires (a SIGKILL leaves no chance afterwards), and a restarted trainer skips the faults listed there.
The faults imitate the real deaths the supervisor must tell apart:
- "oom": raises torch.OutOfMemoryError inside the step, so it goes through the trainer's real CUDA OOM handler;
- "sigbus": a real SIGBUS: touch a page of a mapping whose file was truncated under it (what a NFS hiccup does
  to a mapped corpus); os.kill(SIGBUS) where that does not work;
- "sigkill": SIGKILL to itself (what the OOM killer does; the supervisor finds it as the attempt's last entry of
  faults-fired and says "injected by MINILMD_FAULT: sigkill@N" in the death's detail, daemon/child/death.py,
  instead of blaming the OOM killer or a stranger);
- "hang": stops heartbeats forever (a sleep loop), as a stuck NCCL collective or a frozen mount would;
- "exception": raises RuntimeError (an ordinary crash, traceback in the log).
"""
from __future__ import annotations

import mmap
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from minilmd import procs
from minilmd.jsonlines import append_whole, open_log
from minilmd.names import FAULT_ENV, FAULTS_FIRED
from minilmd.protocol import FAULT_KINDS


class FaultSpecError(ValueError):
    """MINILMD_FAULT does not parse."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int

    def __str__(self) -> str:
        return f"{self.kind}@{self.step}"


def parse_faults(spec: str) -> list[Fault]:
    """"oom@3,sigkill@10" -> [Fault("oom", 3), Fault("sigkill", 10)]; raises FaultSpecError naming the bad part."""
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        kind, sep, step = part.partition("@")
        if not sep or kind not in FAULT_KINDS or not step.strip().isdigit():
            raise FaultSpecError(f"{FAULT_ENV}: {part!r} is not kind@step with kind in {', '.join(FAULT_KINDS)}")
        faults.append(Fault(kind, int(step)))
    return faults


class FaultInjector:
    """Fires the configured faults at their steps, once per run (across restarts)."""

    def __init__(self, run_dir: str | os.PathLike, spec: str | None = None, enabled: bool = True):
        spec = os.environ.get(FAULT_ENV, "") if spec is None else spec
        self.record = Path(run_dir) / FAULTS_FIRED
        self.pending = parse_faults(spec) if enabled else []

    def fired(self) -> set[str]:
        try:
            return set(self.record.read_text(encoding="utf-8").split())
        except FileNotFoundError:
            return set()

    def maybe_fire(self, step: int) -> None:
        """Called at the start of optimizer step `step`, inside the step's error handling."""
        due = [f for f in self.pending if f.step == step]
        if not due:
            return
        already = self.fired()
        for fault in due:
            self.pending.remove(fault)
            if str(fault) in already:
                continue
            fd = open_log(self.record)  # run.dir's, as every append there (minilmd/jsonlines.py)
            try:
                append_whole(fd, f"{fault}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            print(f"minilmd: injecting fault {fault}", flush=True)
            FIRE[fault.kind](step)


def _oom(step: int) -> None:
    import torch

    raise torch.OutOfMemoryError(f"CUDA out of memory (injected by {FAULT_ENV} at step {step})")


def _sigbus(step: int) -> None:
    # a file with no name (O_TMPFILE, else unlinked at once): the SIGBUS kills us before any clean-up could run,
    # and a named one was left in the temporary directory at every injected SIGBUS
    with tempfile.TemporaryFile(prefix="minilmd-sigbus-") as f:
        fd = f.fileno()
        os.write(fd, b"\0" * mmap.PAGESIZE)
        mapped = mmap.mmap(fd, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)
        os.ftruncate(fd, 0)
        mapped[0]  # the page is beyond the end of the file now: the kernel answers with SIGBUS
    procs.signal_self(signal.SIGBUS)  # only if the platform let the read through


def _sigkill(step: int) -> None:
    procs.signal_self(signal.SIGKILL)


def _hang(step: int) -> None:
    while True:
        time.sleep(3600)


def _exception(step: int) -> None:
    raise RuntimeError(f"injected exception ({FAULT_ENV} at step {step})")


FIRE = {"oom": _oom, "sigbus": _sigbus, "sigkill": _sigkill, "hang": _hang, "exception": _exception}
