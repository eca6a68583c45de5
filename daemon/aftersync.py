"""What follows a sync that put a newer step on run.remote, looked at each tick of the supervisor's loop.

daemon/jobs/syncworker.py records the step a sync pushed in state.json's remote_checkpoint (and is at its size
limit); this reads it there. Once it is newer than the step this supervisor started with (or last saw), and no
staging runs (whose fetch brings the kept copy back, or drops it, in its own thread):
- the checkpoint an earlier Slurm job kept in `<run.dir>/unsynced/` (daemon/jobs/keptcopy.py) is removed when the
  remote now holds its step or a newer one: before, it stayed until the run's end or its next start. The removal
  runs in a thread of its own (daemon/base/worker.py), never on the loop: run.dir on a share that hangs held the loop
  there (the stop unanswered, only systemd's watchdog noticed). A removal that has not answered is said once and left
  to its thread, no second one begun beside it; one that failed (its thread raised, or run.dir failed its listing
  or the removal: keptcopy.Left, EIO, EACCES; a refusal, another's entry or a link, is not tried again) is tried
  again after RETRY_S, said once; at the run's end, `at_end`, bounded (a damaged copy set aside in its quarantine/
  too, whatever its step, when the trainer ended done: `finished`);
- the count of a Slurm job's requeues after a last sync that gave up (daemon/slurm/requeue_bound.py) begins again
  (state.json only: on the loop).
Torch-free.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from minilmd.bounded import bounded_probe
from minilmd.daemon.base.worker import Worker, error_words
from minilmd.daemon.jobs import keptcopy
from minilmd.daemon.slurm import requeue_bound

RETRY_S = 60.0
"""A removal that failed (run.dir not writable, a share that answered EIO) is tried again after this."""
SILENT_SAY_S = 60.0
"""A removal that has not answered for this long is said once (a stalled share): the loop goes on without it."""


class AfterSync:
    """Made once the previous state.json is adopted (its remote step is the one this start began with)."""

    def __init__(self, cfg, state, emit: Callable[..., None], retry_s: float = RETRY_S,
                 silent_say_s: float = SILENT_SAY_S, finished: Callable[[], bool] = lambda: False):
        self.cfg, self.state, self.emit = cfg, state, emit
        self.finished = finished
        """Whether the run's trainer ended done (the supervisor's loop knows): its end removes what is set aside."""
        self.retry_s, self.silent_say_s = retry_s, silent_say_s
        self.seen = self._remote_step()
        self.pending: int | None = None
        """The remote step a removal of the kept copy is still to be tried for (None: none to try)."""
        self.removal: Worker | None = None
        self.removal_step: int | None = None
        self.retry_at = 0.0
        """time.monotonic() before which a failed removal is not tried again (a wall clock set back an hour would
        hold it that long)."""
        self.silence_said = False
        self.failure_said = ""

    def _remote_step(self) -> int | None:
        remote = self.state.remote_checkpoint
        return remote.step if remote is not None else None

    def tick(self, staging_running: bool) -> None:
        self._collect()
        step = self._remote_step()
        if step is not None and step != self.seen and not staging_running:
            self.seen = step
            requeue_bound.synced(self.state.slurm, step)
            self.pending = step
        due = time.monotonic() >= self.retry_at
        if self.pending is not None and self.removal is None and not staging_running and due:
            self._begin(self.pending)

    def _begin(self, step: int) -> None:
        """The removal for remote step `step`, in its own thread (daemon/base/worker.py)."""
        self.removal_step, self.pending, self.silence_said = step, None, False
        self.removal = Worker("kept-copy", lambda: keptcopy.drop_if_synced(self.cfg, step))

    @property
    def removing(self) -> bool:
        """Whether a removal's thread has not returned yet."""
        return self.removal is not None and not self.removal.done

    def _collect(self) -> None:
        """A removal's end said (and a failed one tried again later), or its silence said once."""
        removal = self.removal
        if removal is None:
            return
        if not removal.done:
            if not self.silence_said and removal.running_for() >= self.silent_say_s:
                self.silence_said = True
                self.emit("sync", f"removing the copy in {keptcopy.place(self.cfg)} has not answered for "
                                  f"{removal.running_for():.0f} s (a stalled share?): left to its thread, the run "
                                  f"goes on; tried again once it returns")
            return
        self.removal, error = None, removal.error
        left = isinstance(removal.result, keptcopy.Left)  # its listing or removal failed: as a raise, tried again
        if error is None and not left:
            self.failure_said = ""
            if removal.result:
                self.emit("sync", removal.result)
            return
        if self.pending is None:  # a newer remote step meanwhile is tried for instead
            self.pending = self.removal_step
        self.retry_at = time.monotonic() + self.retry_s  # never moved by a clock step
        failed = str(removal.result) if error is None else \
            f"the copy in {keptcopy.place(self.cfg)} is not removed now ({error_words(error)})"
        said = f"{failed}: tried again in {self.retry_s:.0f} s, or at the run's end or next start"
        if said != self.failure_said:  # a run.dir that stays unwritable is said once, not each minute
            self.failure_said = said
            self.emit("sync", said)

    def at_end(self, remote_step: int | None) -> str:
        """At the run's end, once its last sync is done: the kept copy removed if run.remote holds its step (and a
        damaged one set aside, whatever its step, when the trainer ended done: `finished`), within
        the shared-storage probe's bound (minilmd/bounded.py: a share that hangs leaves its thread behind, the run
        ends); not begun while an earlier removal has not returned. What was done, in words ("" when nothing)."""
        where = keptcopy.place(self.cfg)
        self._collect()  # a removal that returned since the last tick: said, not left unsaid
        if self.removing:
            return f"the copy in {where} is left for the next start: removing it has not answered (a stalled share?)"
        answered, said, why = bounded_probe(keptcopy.drop_if_synced, self.cfg, remote_step, self.finished(),
                                           says_why=True)
        return said if answered else f"the copy in {where} is not removed now ({why}): at the next start"
