"""What follows a sync that put a newer step on run.remote, looked at each tick of the supervisor's loop.

daemon/jobs/syncworker.py records the step a sync pushed in state.json's remote_checkpoint (and is at its size
limit); this reads it there. Once it is newer than the step this supervisor started with (or last saw), and no
staging runs (whose fetch brings the kept copy back, or drops it, in its own thread):
- the checkpoint an earlier Slurm job kept in `<run.dir>/unsynced/` (daemon/jobs/keptcopy.py) is removed when the
  remote now holds its step or a newer one: before, it stayed until the run's end or its next start;
- the count of a Slurm job's requeues after a last sync that gave up (daemon/slurm/requeue_bound.py) begins again.
Torch-free.
"""
from __future__ import annotations

from collections.abc import Callable

from minilmd.daemon.jobs import keptcopy
from minilmd.daemon.slurm import requeue_bound


class AfterSync:
    """Made once the previous state.json is adopted (its remote step is the one this start began with)."""

    def __init__(self, cfg, state, emit: Callable[..., None]):
        self.cfg, self.state, self.emit = cfg, state, emit
        self.seen = self._remote_step()

    def _remote_step(self) -> int | None:
        remote = self.state.remote_checkpoint
        return remote.step if remote is not None else None

    def tick(self, staging_running: bool) -> None:
        step = self._remote_step()
        if step is None or step == self.seen or staging_running:
            return
        self.seen = step
        requeue_bound.synced(self.state.slurm, step)
        try:
            said = keptcopy.drop_if_synced(self.cfg, step)
        except Exception as e:  # noqa: BLE001 - run.dir not writable now: the copy goes at the run's end or next start
            said = f"the copy in {keptcopy.place(self.cfg)} is not removed now ({e}): at the run's end, or next start"
        if said:
            self.emit("sync", said)
