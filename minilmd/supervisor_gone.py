"""A supervised trainer notices that its supervisor is gone, and stops as a SIGTERM stops it (it saves, exits 75):
nothing trains unsupervised. Before, a trainer whose supervisor was SIGKILLed trained on with nobody pruning its
scratch (/dev/shm filled: 66 -> 119 MB in a minute at a tiny model) nor syncing it, until a supervisor started again
hunted it down, and a restart that ended at once on a config error never did (user8 #2).

How: the supervisor puts its own identity in every trainer's environment (names.SUPERVISOR_PROCESS_ENV: pid, start
time, host), and the trainer looks at it when the loop asks whether to stop (StopFlag.requested, at every step
boundary and DPO reference batch), at most once a second: one read of /proc/PID/stat. Not PR_SET_PDEATHSIG: the
supervisor launches torchrun or srun as often as the trainer itself, and a rank's parent is torchrun, which sets no
death signal for its ranks; a death signal fires when the parent *thread* ends, not the process; and setting it in
the child needs a preexec_fn, unsafe in the supervisor, which runs threads. The environment reaches every rank on
the supervisor's host, and each one stops by itself (the ranks agree on a stop: trainer/loop/guards.py agree); ranks
on other hosts stop with them. A `minilmd train` by hand carries no such identity, and is not affected.
Torch-free."""
from __future__ import annotations

import os
import socket
import time

from minilmd.names import SUPERVISOR_PROCESS_ENV
from minilmd.procs import process_alive

CHECK_EVERY_S = 1.0


class SupervisorWatch:
    """Whether the supervisor that launched this trainer has ended (never, for a trainer without one, or one whose
    supervisor runs on another host: its ranks there learn of the stop from this host's)."""

    def __init__(self, environ=os.environ):
        self.pid: int | None = None
        self.ticks: int | None = None
        self.next_check = 0.0
        self.ended = False
        parts = environ.get(SUPERVISOR_PROCESS_ENV, "").split()
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit() and parts[2] == socket.gethostname():
            self.pid, self.ticks = int(parts[0]), int(parts[1])

    def gone(self) -> bool:
        if self.pid is None or self.ended:
            return self.ended
        now = time.monotonic()
        if now >= self.next_check:
            self.next_check = now + CHECK_EVERY_S
            self.ended = not process_alive(self.pid, self.ticks)
        return self.ended

    def why(self) -> str:
        return (f"its supervisor (pid {self.pid}) has ended: stopping as a SIGTERM would, so that nothing trains "
                "unsupervised")
