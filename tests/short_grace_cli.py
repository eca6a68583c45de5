"""`minilmd` whose supervisor waits for a trainer's first heartbeat TEST_STARTUP_GRACE_S seconds (daemon/child/
trainerwatch.py STARTUP_GRACE_S, 60 s, in use), for a test whose trainer must outlast that grace before its first
step, without waiting out a minute:

    TEST_STARTUP_GRACE_S=30 python tests/short_grace_cli.py run CONFIG   (in place of `minilmd run CONFIG`)

Only this process is patched: the trainer it launches is the one it would launch.
"""
from __future__ import annotations

import os

from minilmd.daemon.child import trainerwatch

GRACE_ENV = "TEST_STARTUP_GRACE_S"

if __name__ == "__main__":
    from minilmd.cli import main

    trainerwatch.STARTUP_GRACE_S = float(os.environ[GRACE_ENV])
    main()
