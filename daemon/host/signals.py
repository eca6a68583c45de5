"""The supervisor's signals: SIGTERM/SIGINT (stop), SIGHUP (reopen supervisor.log), SIGUSR1 (Slurm's warning).
The handlers only record what came; the supervisor's loop acts on it at its next tick. Torch-free."""
from __future__ import annotations

import signal
from dataclasses import dataclass


@dataclass
class Signals:
    """What the handlers saw; only the loop acts on it."""

    stop: int = 0  # count of SIGTERM/SIGINT received
    hup: bool = False
    usr1: bool = False  # Slurm's --signal warning: preemption or the time limit is near (daemon/slurm/job.py)

    def install(self) -> None:
        def on_stop(signum, frame):
            self.stop += 1

        def on_hup(signum, frame):
            self.hup = True

        def on_usr1(signum, frame):
            self.usr1 = True

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)
        signal.signal(signal.SIGUSR1, on_usr1)
