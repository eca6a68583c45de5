"""`minilmd train`, the real trainer, that removes its run's scratch once, after it has ended done (exit 0): the
scratch gone before the supervisor's last sync copied the last step (fault11 F2), without a stalled remote. With
tests/pausing_trainer.py's "pause@N" (MINILMD_FAULT), so that a test can hold it until the remote holds a step.

    MINILMD_TRAINER_CMD="python tests/scratch_gone_at_end_trainer.py"
    SCRATCH_GONE_AT_END="<run.scratch>:<a flag file>"   (the flag made at the removal: a later attempt removes nothing)
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ENV = "SCRATCH_GONE_AT_END"


def _remove_once() -> None:
    scratch, flag = os.environ[ENV].rsplit(":", 1)
    try:
        fd = os.open(flag, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(fd)
    shutil.rmtree(Path(scratch))  # the user's `rm -rf` just as the trainer ends


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))  # the trainer's start may leave this script's folder out
    import pausing_trainer  # noqa: F401 - its "pause@N" too: the test holds the trainer until a step is synced
    from minilmd.cli import main

    try:
        main()
    except SystemExit as e:
        if e.code in (0, None):
            _remove_once()
        raise
    _remove_once()
