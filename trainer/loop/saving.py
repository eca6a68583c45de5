"""The run's checkpoints as the training loop asks for them (the Trainer's `saves`, trainer/loop/train.py).

When one is due (train.checkpoint_every_steps, or checkpoint_every_s: a duration only changes when saves happen,
never what the run computes; during DPO's reference pass, before any step, checkpoint_every_s, or PASS_SAVE_EVERY_S
for a checkpoint_every in steps: `pass_due`), writing one (rank 0 snapshots the weights to CPU and writes them in a
background thread, AsyncCheckpointer, which also prunes when unsupervised; the other ranks wait at a barrier: their
weights are the same), keeping the best one (BEST) and finishing before an exit. What was saved last lives here alone.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as torch_dist

from minilmd.config import RunConfig
from minilmd.config_sections import TrainSection, parse_duration
from minilmd.metrics import MetricsLog
from minilmd.names import REFERENCE_PASS, step_name
from minilmd.trainer.checkpoint.save import AsyncCheckpointer, mark_best
from minilmd.trainer.loop.distributed import Dist
from minilmd.trainer.loop.guards import LossGuard

PASS_SAVE_EVERY_S = parse_duration(TrainSection.checkpoint_every)
"""How often DPO's reference pass saves its sums so far when train.checkpoint_every counts steps: the key's default
duration (5m), as the pass takes no step (and its batches run at another pace than the training steps)."""


class Saves:
    """The run's checkpoints: `contents()` gives (model, optimizer, trainer_state.json's dict) of the step saved,
    asked on rank 0 only."""

    def __init__(self, cfg: RunConfig, dist: Dist, checkpointer: AsyncCheckpointer, log: MetricsLog,
                 loss_guard: LossGuard,
                 contents: Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer, dict]]):
        self.cfg, self.dist, self.checkpointer, self.log = cfg, dist, checkpointer, log
        self.loss_guard, self.contents = loss_guard, contents
        self.last_step: int | None = None
        """The step of the newest checkpoint this process wrote (or began at: `begin`)."""
        self.last_time = time.monotonic()

    def begin(self, step: int) -> None:
        """Training starts at `step`: nothing to save before a step is taken; a duration counts from now."""
        self.last_step, self.last_time = step, time.monotonic()

    def saved(self, step: int) -> bool:
        return step == self.last_step

    def due(self, step: int) -> bool:
        """Whether to save at `step`: every checkpoint_every_steps steps, or checkpoint_every_s after the last."""
        steps, seconds = self.cfg.train.checkpoint_every_steps, self.cfg.train.checkpoint_every_s
        if self.saved(step):
            return False
        if steps is not None:
            return step % steps == 0
        return seconds is not None and time.monotonic() - self.last_time >= seconds

    def pass_due(self) -> bool:
        """Whether to save the DPO reference pass so far (trainer/loop/dpo_reference.py), asked between two of its
        batches: checkpoint_every_s after the last save (or the start), or PASS_SAVE_EVERY_S when checkpoint_every
        counts steps (the pass takes none): a kill then loses at most that much of the pass."""
        every = self.cfg.train.checkpoint_every_s
        return time.monotonic() - self.last_time >= (PASS_SAVE_EVERY_S if every is None else every)

    def save_pass(self, step: int, kept: dict[str, bytes], done: int, total: int) -> None:
        """Step `step` (0) with the reference pass so far: `kept` (its reference file: the sums done, how far it got)
        and the manifest's REFERENCE_PASS [done, total] (the sync's measure of it, daemon/jobs/sync_pass.py). The
        periodic save and the stop's alike; the complete pass's files clear the note (`pass_complete`)."""
        self.checkpointer.extra = kept
        self.checkpointer.notes = {REFERENCE_PASS: [done, total]}
        self.save(step)

    def pass_complete(self, files: dict[str, bytes]) -> None:
        """The reference pass is done: every checkpoint from here on carries `files` (its sums) and no pass note."""
        self.checkpointer.extra, self.checkpointer.notes = files, {}

    def save(self, step: int, best: bool = False) -> None:
        """Checkpoint `step` (with `best`, BEST then names it); returns once rank 0 holds a CPU copy."""
        t0 = time.perf_counter()  # blocking_s: the whole stall the loop sees, from here to the return
        self.log.heartbeat(step, force=True)
        self.loss_guard.flush()
        self.barrier()
        if self.dist.is_main:
            self.checkpointer.save(step, *self.contents(), best)
        self.barrier()
        if self.dist.is_main:
            blocking, waited = time.perf_counter() - t0, self.checkpointer.last_wait_s
            path = self.cfg.checkpoint_dir / step_name(step)
            self.log.write("checkpoint", step=step, blocking_s=round(blocking, 4), waited_s=round(waited, 4),
                           path=str(path))
            print(f"minilmd: saving {path} (loop blocked {blocking:.3f}s, {waited:.3f}s of it waiting for the "
                  f"previous write)", flush=True)
        self.last_step, self.last_time = step, time.monotonic()

    def mark_best(self, step: int) -> None:
        """`step` is the best so far: save it as BEST, or, saved already (or being saved), point BEST at it once it
        is on disk."""
        if not self.saved(step):
            self.save(step, best=True)
        elif self.dist.is_main:
            self.checkpointer.wait()
            mark_best(self.cfg.checkpoint_dir, step_name(step))

    def wait(self) -> None:
        """Wait until the checkpoint in flight is on disk; raises if its write failed."""
        if self.dist.is_main:
            self.checkpointer.wait()

    def finish(self, step: int, phase: str = "") -> None:
        """Before an exit: save `step` if it is not saved, wait for the write, and say `step` (and `phase`,
        "exiting": the supervisor allows restart.exit_timeout for the teardown) in the heartbeat.

        Under torchrun every rank waits at a barrier until rank 0's write is on disk (`exit_barrier`): torchrun stops
        the ranks still running as soon as one exits with a nonzero status (a stop's 75, a full run.dir's 73),
        SIGTERM then SIGKILL 30 s later, so a rank that exited at once cut a write longer than that (review9c #3)."""
        if not self.saved(step):
            self.save(step)
        self.wait()
        self.exit_barrier()
        self.log.heartbeat(step, phase=phase, force=True)

    def exit_barrier(self) -> None:
        """All ranks meet once rank 0's last write is durable. On the gloo group (the control group beside NCCL):
        bounded by its timeout (default_pg_timeout, 30 min); a rank 0 that died instead closes its connections, which
        ends the wait with an error on the others, whether they were in it or entered it later (a crash beside rank
        0's own end, never a hang: tests/test_torchrun_exit_barrier.py)."""
        if self.dist.active:
            torch_dist.barrier(group=self.dist.control_group)

    def barrier(self) -> None:
        if self.dist.active:
            torch_dist.barrier()
