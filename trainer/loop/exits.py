"""The exit status of a trainer that failed (trainer/loop/entry.py run(); the statuses in minilmd/protocol.py): a bad
config, bad data, a checkpoint of another run, a full scratch, a crash, or a stop before its loop began; what is
written for the supervisor (fault.json) and said on stderr."""
from __future__ import annotations

import os
import socket
import sys
import traceback

from minilmd.checkpoint import CheckpointMismatch
from minilmd.checkpoint_pin import ScratchGone
from minilmd.config import ConfigError, RunConfig
from minilmd.corpus_meta import CorpusError
from minilmd.cuda_oom import cuda_oom_source, first_line
from minilmd.metrics import RunDirFileRefused, RunDirGone
from minilmd.plan.sampler_base import DataError
from minilmd.protocol import (
    EXIT_CONFIG,
    EXIT_CRASH,
    EXIT_CUDA_OOM,
    EXIT_DATA,
    EXIT_RUN_DIR_FULL,
    EXIT_SCRATCH_FULL,
    FaultNote,
    write_fault,
)
from minilmd.supervision import supervision
from minilmd.trainer.checkpoint.save import ScratchFull
from minilmd.trainer.loop import determinism
from minilmd.trainer.loop.faults import FaultSpecError


def status_of(cfg: RunConfig, e: Exception, dist, step: int) -> int:
    """The exit status of a run that raised `e` at `step`; called inside its except clause (a crash's traceback)."""
    if isinstance(e, (ConfigError, FaultSpecError, RunDirFileRefused)):
        print(f"minilmd train: {e}", file=sys.stderr)
        return refused(cfg, EXIT_CONFIG, "\n".join(e.problems) if isinstance(e, ConfigError) else str(e))
    if isinstance(e, RunDirGone):  # no fault.json: there is no run.dir for it (as for a full one, exit 73)
        print(f"minilmd train: {e}", file=sys.stderr)
        return EXIT_RUN_DIR_FULL
    if isinstance(e, (DataError, CorpusError)):
        print(f"minilmd train: {e}", file=sys.stderr)
        return refused(cfg, EXIT_DATA, str(e))
    if isinstance(e, CheckpointMismatch):  # resuming another model, tokenizer or corpus: final, never a fresh start
        print(f"minilmd train: refusing to resume: {e}", file=sys.stderr)
        return refused(cfg, e.exit_status, f"refusing to resume: {e}")
    if isinstance(e, ScratchFull):  # the supervisor makes room or waits for it; a restart now would only repeat
        return scratch_full(cfg, e, step)
    if isinstance(e, ScratchGone):
        return scratch_gone(cfg, e, step)
    return crashed(cfg, e, dist, step)  # any other crash: its traceback to the log, a restartable exit status


def refused(cfg: RunConfig, status: int, words: str) -> int:
    """A final refusal (a config or data error), whole, for the supervisor (fault.json, kind "refused"): the
    attempt log's last lines are only its end, a [model] block to paste without the sentence that says why."""
    try:
        write_fault(cfg.run_dir, FaultNote.REFUSED, words, exit=status)
    except OSError:
        pass  # run.dir unwritable or full: the supervisor reads the attempt log instead
    return status


def scratch_full(cfg: RunConfig, e, step: int) -> int:
    """The supervisor makes room or waits for it; a restart now would only repeat (e: save.ScratchFull)."""
    try:
        write_fault(cfg.run_dir, FaultNote.SCRATCH_FULL, str(e), step=step, checkpoint_step=e.step, needs=e.needs,
                    free=e.free, path=str(e.root), host=socket.gethostname())
    except OSError:
        pass  # run.dir on the same full disk: the exit status alone says it
    print(f"minilmd train: {e}", file=sys.stderr)
    return EXIT_SCRATCH_FULL


def scratch_gone(cfg: RunConfig, e: ScratchGone, step: int) -> int:
    """run.scratch was removed (`rm -rf` to free /dev/shm) while the run trained: the save was refused, nothing made
    again by path. One line, fault.json kind scratch_gone, and a restartable exit: the supervisor's next attempt
    claims scratch afresh, stages and resumes from the newest synced checkpoint (daemon/jobs/stagingworker.py)."""
    refused = f"step {e.step} not saved" if e.step is not None else "nothing saved"
    then = "the supervisor stages again and resumes from the newest synced checkpoint" if supervision() else \
        "the next `minilmd train` starts from what scratch holds then"
    message = f"run.scratch {cfg.scratch_dir} was removed while the run trained ({e.why}): {refused}; {then}"
    try:
        write_fault(cfg.run_dir, FaultNote.SCRATCH_GONE, message, step=step, checkpoint_step=e.step,
                    path=str(cfg.scratch_dir))
    except OSError:
        pass  # run.dir unwritable: the attempt log's last line says it
    print(f"minilmd train: {message}", file=sys.stderr)
    return EXIT_CRASH


def scratch_without_room(e) -> int:
    """Scratch had no room (inodes or bytes) for a file of the trainer's start, its lock (e: trainer_lock
    .TrainerLockNoRoom): exit 74 as a checkpoint that does not fit, fault.json kind scratch_full with the room left
    there and no bytes of a checkpoint (the supervisor counts its own, and the inodes a start needs); the supervisor
    waits for room (waiting_space) and starts the trainer again once there is. `host`: the node whose scratch is
    full (every node's local rank 0 takes its scratch's lock): the supervisor measures only its own, so another
    node's is an ordinary counted failure for it (daemon/attempt.py `on_another_node`; review11a F2b)."""
    try:
        vfs = os.statvfs(e.scratch)
        room = {"free": vfs.f_bavail * vfs.f_frsize, "inodes_free": vfs.f_favail if vfs.f_files else None}
    except OSError:
        room = {}
    try:
        write_fault(e.run_dir, FaultNote.SCRATCH_FULL, str(e), path=str(e.scratch), host=socket.gethostname(), **room)
    except OSError:
        pass  # run.dir on the same full disk: the exit status alone says it
    print(f"minilmd train: {e}", file=sys.stderr)
    return EXIT_SCRATCH_FULL


class StoppedInPass(Exception):
    """A stop acted on during the DPO reference pass (trainer/loop/dpo_reference.py), before the Trainer's loop: the
    pass's sums so far are saved at step 0 (`kept`: the reference file the Trainer saves with it), the next start
    goes on from there. `why` and `exit_status` are the StopFlag's: a SIGTERM/SIGINT exits 75, a full run.dir 73."""

    def __init__(self, why: str, exit_status: int, done: int, total: int):
        super().__init__(f"{why} during the DPO reference pass ({done:,}/{total:,} pairs); the pairs done are saved "
                         f"at step 0: the next start goes on from there")
        self.kept: dict[str, bytes] = {}
        self.exit_status = exit_status
        self.done, self.total = done, total


def crashed(cfg: RunConfig, e: Exception, dist, step: int) -> int:
    """Any other exception: a stop during the DPO reference pass (75, or 73 on a full run.dir), a refused
    deterministic kernel (the same next time: a config error), a CUDA OOM in any of its shapes (fault.json written
    first), else its traceback to the log and a restartable exit status."""
    if isinstance(e, StoppedInPass):
        print(f"minilmd: {e}", flush=True)
        return e.exit_status
    if (refused := determinism.refusal(e, cfg)) is not None:
        print(f"minilmd train: {refused}", file=sys.stderr)
        return EXIT_CONFIG
    source = cuda_oom_source(e)  # torch.OutOfMemoryError, and the CUDA/cuBLAS/NCCL OOMs that are not one
    if source is None:
        traceback.print_exc()
        return EXIT_CRASH
    message = first_line(e)
    write_fault(cfg.run_dir, FaultNote.CUDA_OOM, message, step=step, micro_batch_size=cfg.train.micro_batch_size,
                device=str(dist.device) if dist else "?", rank=dist.rank if dist else 0, source=source)
    print(f"minilmd train: CUDA out of memory ({source}) at step {step}: {message}", file=sys.stderr)
    return EXIT_CUDA_OOM
