"""`minilmd train` whose DPO reference pass is slow, for tests of a pass that outlasts the supervisor's limits:

    MINILMD_TRAINER_CMD="python tests/slow_reference_trainer.py"    (in place of `python -m minilmd.cli`)

Each batch of the reference pass (trainer/loop/dpo_reference.py) sleeps BATCH_SLEEP_S (or $SLOW_REFERENCE_BATCH_S)
seconds before it runs: a pass of N batches lasts at least N times that, however fast the machine, as a big
preference corpus's pass does on a real model. Training itself is untouched (objective_dpo's own sequence_logps): the
trainer is otherwise the real one, run in this process.
"""
from __future__ import annotations

import os
import time

from minilmd.trainer.loop import dpo_reference

BATCH_SLEEP_ENV = "SLOW_REFERENCE_BATCH_S"
BATCH_SLEEP_S = float(os.environ.get(BATCH_SLEEP_ENV, "0.1"))
_reference_logps = dpo_reference.sequence_logps


def _slow_logps(*args, **kwargs):
    time.sleep(BATCH_SLEEP_S)
    return _reference_logps(*args, **kwargs)


dpo_reference.sequence_logps = _slow_logps

if __name__ == "__main__":
    from minilmd.cli import main

    main()
