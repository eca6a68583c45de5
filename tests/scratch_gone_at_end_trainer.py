"""`minilmd train`, the real trainer, that removes its run's scratch once, after it has ended done (exit 0): the
scratch gone before the supervisor's last sync copied the last step (fault11 F2), without a stalled remote. With
tests/pausing_trainer.py's "pause@N" (MINILMD_FAULT), so that a test can hold it until the remote holds a step.

    MINILMD_TRAINER_CMD="python tests/scratch_gone_at_end_trainer.py"
    SCRATCH_GONE_AT_END="<run.scratch>:<a flag file>"   (the flag made at the removal: a later attempt removes nothing;
                                                     scratch is renamed to <flag>.scratch, on the same file system,
                                                     then removed)
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
    # The user's `rm -rf` just as the trainer ends, made whole at once: the supervisor looks at the newest checkpoint
    # as it appears (its prune), and one met half removed is quarantined under the rmtree, which then fails and
    # crashed this trainer (exit 1: seen once in a CI run; the run resumed from an older step and still ended done,
    # but by the crash path, not the one tested). Renamed away first, scratch is gone in one step; what the
    # supervisor may still move inside the renamed tree meanwhile is removed by the next pass.
    gone = Path(f"{flag}.scratch")
    os.rename(scratch, gone)
    for _ in range(100):
        shutil.rmtree(gone, ignore_errors=True)
        if not os.path.lexists(gone):
            return
    raise RuntimeError(f"{gone} could not be removed")


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
