"""`minilmd train` with one more MINILMD_FAULT kind, for tests that act on a run at a known step:

    MINILMD_TRAINER_CMD="python tests/pausing_trainer.py"    (in place of `python -m minilmd.cli`)

"pause@N" stops the trainer (SIGSTOP to itself) just before optimizer step N, once per run like every injected
fault (trainer/loop/faults.py: recorded in faults-fired first): a hold the test releases with SIGCONT, or ends with
SIGKILL. A test can then kill the supervisor, take the remote away or ask for a stop while the run is surely
unfinished, however fast its tiny steps are and however loaded the machine. The trainer is otherwise the real one:
it runs `minilmd train ...` in this process.
"""
from __future__ import annotations

import os
import signal

from minilmd.trainer.loop import faults


def _pause(step: int) -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


faults.FAULT_KINDS = (*faults.FAULT_KINDS, "pause")
faults.FIRE["pause"] = _pause

if __name__ == "__main__":
    from minilmd.cli import main

    main()
