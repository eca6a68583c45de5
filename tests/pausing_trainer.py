"""`minilmd train` with two more MINILMD_FAULT kinds, for tests that act on a run at a known step:

    MINILMD_TRAINER_CMD="python tests/pausing_trainer.py"    (in place of `python -m minilmd.cli`; under a Slurm
    srun launch too, where torchrun starts it in each rank: daemon/slurm/job.py rank_program)

"pause@N" stops the trainer (SIGSTOP to itself) just before optimizer step N, once per run like every injected
fault (trainer/loop/faults.py: recorded in faults-fired first): a hold the test releases with SIGCONT, or ends with
SIGKILL. A test can then kill the supervisor, take the remote away or ask for a stop while the run is surely
unfinished, however fast its tiny steps are and however loaded the machine.
"hold@N" stops it there for the rest of its life: every SIGCONT finds it stopping itself again (Slurm sends one
before the SIGTERM with which it ends a job), so the trainer surely never passes step N; only a SIGKILL ends it.
The trainer is otherwise the real one: it runs `minilmd train ...` in this process. held.py finds a held trainer.
"""
from __future__ import annotations

import os
import signal

from minilmd.trainer.loop import faults


def _pause(step: int) -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def _hold(step: int) -> None:
    while True:  # a SIGTERM's handler only sets the trainer's stop flag: it returns here
        os.kill(os.getpid(), signal.SIGSTOP)


faults.FAULT_KINDS = (*faults.FAULT_KINDS, "pause", "hold")
faults.FIRE["pause"] = _pause
faults.FIRE["hold"] = _hold

if __name__ == "__main__":
    from minilmd.cli import main

    main()
