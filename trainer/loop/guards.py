"""What stops trainer/loop/train.py's loop between two steps: a SIGTERM/SIGINT (StopFlag: its handlers only record
it), its supervisor's end (minilmd/supervisor_gone.py: stopped as a SIGTERM stops it) or a full run.dir
(StopFlag.writes: the trainer's own writes there, its log included: OutputOnFullDisk), agreed on by every rank
(agree: the stop, and whether run.dir is full: every rank's exit status), and a non-finite training loss
(LossGuard: checked every step, read without a host sync per step on CUDA)."""
from __future__ import annotations

import math
import signal
import sys
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as torch_dist

from minilmd.metrics import RunDirWrites
from minilmd.protocol import EXIT_RUN_DIR_FULL, EXIT_STOPPED
from minilmd.supervisor_gone import SupervisorWatch
from minilmd.trainer.loop.distributed import Dist


class StopFlag:
    """SIGTERM/SIGINT handlers only record the request; the loop acts on it at the next step boundary. So it does on
    a full run.dir (`writes.full`), saving to scratch first, then exits 73 instead of 75 (`exit_status`)."""

    def __init__(self):
        self.signalled = False
        self.signal_name = ""
        self.writes = RunDirWrites()
        self.supervisor = SupervisorWatch()

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signalled = True
        self.signal_name = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self.signalled or self.writes.full is not None or self.supervisor.gone()

    def why(self) -> str:
        if self.writes.full is not None:
            return self.writes.why()
        if not self.signalled and self.supervisor.ended:
            return self.supervisor.why()
        return f"{self.signal_name or 'stop'} received"

    def exit_status(self) -> int:
        return EXIT_RUN_DIR_FULL if self.writes.full is not None else EXIT_STOPPED

    def agreed(self, dist: Dist, save_due: bool) -> tuple[bool, bool]:
        """(stop, save) as every rank will act on them (agree). A run.dir that another rank found full is this
        rank's too: every rank then exits 73, and torchrun passes one status on (trainer/loop/torchrun.py;
        before, the rank that found it exited 73 and the others 75, and torchrun said 1: a crash)."""
        stop, save, full = agree(dist, self.requested, save_due, self.writes.full is not None)
        if full and self.writes.full is None:
            self.writes.full = "another rank's write there found no room"
        return stop, save


class OutputOnFullDisk:
    """sys.stdout or sys.stderr of the trainer, whose output (its attempt log) lives in run.dir: a print that finds
    the disk full is dropped and counted in `writes`, never raised (in a save, it would lose the save)."""

    def __init__(self, inner, writes: RunDirWrites, what: str):
        self.inner, self.writes, self.what = inner, writes, what

    def write(self, text: str) -> int:
        try:
            return self.inner.write(text)
        except OSError as e:
            self.writes.failed(e, self.what)
            return len(text)

    def flush(self) -> None:
        try:
            self.inner.flush()
        except OSError as e:
            self.writes.failed(e, self.what)

    def __getattr__(self, name: str):  # fileno (faulthandler), isatty, encoding: the stream's own
        return getattr(self.inner, name)


@contextmanager
def tolerating_full_run_dir(writes: RunDirWrites) -> Iterator[None]:
    """The trainer's stdout and stderr as OutputOnFullDisk while it runs: its log, on a full run.dir, costs no
    save. Given back after (a run in a test's own process), unless a write found the disk full: the streams may
    hold what they could not write, and Python's own flush at exit, failing, would turn the exit status into 120."""
    saved = sys.stdout, sys.stderr
    sys.stdout = OutputOnFullDisk(sys.stdout, writes, "its log (stdout)")
    sys.stderr = OutputOnFullDisk(sys.stderr, writes, "its log (stderr)")
    try:
        yield
    finally:
        if writes.full is None:
            sys.stdout, sys.stderr = saved


class LossGuard:
    """Stops the run at the first non-finite training loss, checked every step, without a host sync per step.

    On the CPU the loss is read at once: there is no device to wait for. On CUDA reading it would stall the loop
    until the GPU catches up, so each step's loss is copied into pinned host memory without blocking and read at
    a later step, once a CUDA event says the copy has landed (asking never waits); `flush()` waits for the pending
    ones, and the loop calls it before every save: a non-finite model is never saved."""

    def __init__(self, device: torch.device):
        self.lazy = device.type == "cuda"
        self.pending: deque = deque()  # (step, pinned host copy of the loss, CUDA event after the copy)

    def check(self, step: int, loss: torch.Tensor) -> None:
        if not self.lazy:
            self.require_finite(step, float(loss))
            return
        host = torch.empty(loss.shape, dtype=loss.dtype, pin_memory=True)
        host.copy_(loss.detach(), non_blocking=True)
        landed = torch.cuda.Event()
        landed.record()
        self.pending.append((step, host, landed))
        while self.pending and self.pending[0][2].query():
            done_step, value, _ = self.pending.popleft()
            self.require_finite(done_step, float(value))

    def flush(self) -> None:
        while self.pending:
            step, value, landed = self.pending.popleft()
            landed.synchronize()
            self.require_finite(step, float(value))

    @staticmethod
    def require_finite(step: int, loss: float) -> None:
        if not math.isfinite(loss):
            raise RuntimeError(f"the training loss is {loss} at step {step}: refusing to continue and to save a "
                               f"non-finite model (lower train.lr or check the data)")


def agree(dist: Dist, stop: bool, save_due: bool, full: bool = False) -> tuple[bool, bool, bool]:
    """All ranks act on the same step: any rank's stop request stops all, rank 0's clock decides saves, and any
    rank's full run.dir is every rank's (`full`: StopFlag.agreed gives them all its exit status, 73).

    The flags travel as a CPU tensor through a gloo group (Dist.control_group beside NCCL): reading the result
    waits only for the other ranks' host threads, never for this GPU's queue of kernels, so the host keeps
    running ahead of the device. A CUDA tensor through NCCL made `.item()` a full host-device sync every step.
    Agreeing every N steps instead would also avoid the sync but delay a stop or a duration-based save by up
    to N steps, and add a rule for choosing N; a localhost gloo all-reduce of 12 bytes costs tens of
    microseconds of host time per step, off the device's critical path."""
    if not dist.active:
        return stop, save_due, full
    flags = torch.tensor([int(stop), int(save_due and dist.is_main), int(full)], dtype=torch.int32)
    torch_dist.all_reduce(flags, op=torch_dist.ReduceOp.MAX, group=dist.control_group)
    return bool(flags[0]), bool(flags[1]), bool(flags[2])
