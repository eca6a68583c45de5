"""The waiting_space phase: a trainer's checkpoint did not fit in scratch; make room, and wait until one fits.

The trainer refuses a save that does not fit before it writes anything (trainer/checkpoint/save.py: it never fills
the disk to the last byte, which would hurt the other users of /dev/shm) and exits 74 with fault.json saying the
bytes it needs and the bytes free. `SpaceWaiter.start()` records the wait in state.json "space_wait"; `tick()`,
asked by the loop in this phase, prunes scratch (`SyncWorker.make_room`: the oldest checkpoints, synced or not)
and measures the free space again every SPACE_CHECK_S, and answers True once a checkpoint fits. Waiting is not
restarting: nothing here counts towards restart.max_restarts or restart.no_progress_limit, however long another
job holds the space; status shows the numbers.
The same wait follows a start that found no room in scratch after staging, inodes or bytes (another user's files):
the trainer's lock (exit 74, minilmd/trainer_lock.py) or the launch's compile caches (daemon/attempt.py). A check
then also wants the inodes a start and a checkpoint make (scratch_room.START_INODES) free, where the file system
counts them, and its reason says what is used up and whose entries fill scratch's file system
(minilmd/roomwords.py). Torch-free.
"""
from __future__ import annotations

from minilmd import names
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.daemon.base.runstate import RunState, now
from minilmd.daemon.base.statesections import LocalCheckpoint, SpaceWait
from minilmd.daemon.jobs.scratch_room import START_INODES, checkpoint_bytes
from minilmd.fmt import fmt_mb as mb
from minilmd.roomwords import inodes_free, room_now

SPACE_CHECK_S = 2.0
"""How often scratch is pruned and measured again while waiting."""


class SpaceWaiter:
    """`state` is the run's RunState ("space_wait", and "local_checkpoint" when the failed save was announced),
    `emit(kind, message, **details)` logs an event, `sync` the SyncWorker that prunes scratch."""

    def __init__(self, cfg, state: RunState, emit, sync):
        self.cfg = cfg
        self.state = state
        self.emit = emit
        self.sync = sync
        self.next_check = 0.0
        self.words = ""
        """What scratch's file system has left and whose entries fill it, at the last check that found no room."""

    def start(self, fault: dict | None) -> str:
        """Begin a wait for the room fault.json describes (None: the launch's, which has none): the bytes of the
        save that did not fit, else of the newest checkpoint, else of one of this model; the phase's reason."""
        fault = fault or {}
        needs = int(fault.get("needs") or 0) or self.sync.newest_size() or checkpoint_bytes(self.cfg, 0)
        self.state.space_wait = SpaceWait(since=now(), needs=needs, free=fault.get("free"),
                                          path=str(self.cfg.checkpoint_dir), checks=0, inodes=START_INODES,
                                          inodes_free=inodes_free(self.cfg.scratch_dir))
        self.words = room_now(self.cfg.scratch_dir)  # what ran out and whose entries hold it, from the start
        self._forget_unsaved_checkpoint()
        self.next_check = 0.0  # the first tick prunes at once: usually that is all it takes
        return self.reason()

    def tick(self) -> bool:
        """True once a checkpoint fits, and the inodes a start and a checkpoint need are free (the wait is over and
        forgotten); else False, and `reason()` has the numbers of the latest check and whose entries fill scratch
        (the loop shows it)."""
        if now() < self.next_check:
            return False
        self.next_check = now() + SPACE_CHECK_S
        wait = self.state.space_wait
        assert wait is not None  # start() began the wait
        free = self.sync.make_room(wait.needs)
        inodes = inodes_free(self.cfg.scratch_dir)
        wait.free, wait.inodes_free, wait.checks = free, inodes, wait.checks + 1
        if (free is not None and free < wait.needs) or (inodes is not None and inodes < wait.inodes):
            self.words = room_now(self.cfg.scratch_dir)
            return False
        self.emit("space", f"scratch has room again: {mb(free)} free{_inodes(inodes)}, a start and a checkpoint "
                           f"need {mb(wait.needs)}{_inodes(wait.inodes if inodes is not None else None)} "
                           f"(waited {now() - (wait.since or now()):.0f}s)")
        self.state.space_wait = None
        return True

    def reason(self) -> str:
        wait = self.state.space_wait
        assert wait is not None  # asked during the wait only
        counted = wait.inodes_free is not None
        return f"scratch full: waiting for space (needs {mb(wait.needs)}{_inodes(wait.inodes if counted else None)}" \
               f", has {mb(wait.free)} free{_inodes(wait.inodes_free)} in {wait.path})" \
               + (f": {self.words}" if self.words else "")

    def _forget_unsaved_checkpoint(self) -> None:
        """The trainer announced the save in metrics.jsonl before it failed: status shows the newest that exists."""
        steps = local_checkpoint_steps(self.cfg.checkpoint_dir)
        shown = self.state.local_checkpoint.step if self.state.local_checkpoint else None
        if shown is None or (steps and shown <= steps[-1]):
            return
        path = self.cfg.checkpoint_dir / names.step_name(steps[-1]) if steps else None
        self.state.local_checkpoint = LocalCheckpoint(step=steps[-1], time=path.stat().st_mtime,
                                                      path=str(path)) if path else None


def _inodes(count: int | None) -> str:
    return f" and {count:,} inodes" if count is not None else ""
