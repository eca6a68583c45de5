"""`minilmd` whose supervisor waits less where a test asks it to, one variable a wait, for the tests that wait such
a wait out but race nothing against its length:

    TEST_STARTUP_GRACE_S=30 python tests/quick_cli.py run CONFIG   (in place of `minilmd run CONFIG`)

- TEST_STARTUP_GRACE_S: daemon/child/trainerwatch.py STARTUP_GRACE_S (60 s in use), the wait for a trainer's first
  heartbeat;
- TEST_READ_AGAIN_AFTER_S: daemon/jobs/fetch.py READ_AGAIN_AFTER_S (2 s, then 5 s in use), the pauses before a
  remote checkpoint that does not verify is read again, comma-separated (as many as in use: as many reads);
- TEST_RELIST_AFTER_S: daemon/jobs/stagingfetch.py RELIST_AFTER_S (5 s in use), the pause before a remote that lists
  no step as new as the run's records say is listed again;
- TEST_STAGING_COPY_FIRST_S: daemon/jobs/staging.py stage()'s first pause before a corpus file that failed is copied
  again (minilmd/backoff.py STAGING_COPY_FIRST_S, 1 s in use, doubling: 1 + 2 + 4 s before a staging fails);
- TEST_SYNC_LOOK_AGAIN_S: daemon/jobs/syncworker.py LOOK_AGAIN_S (30 s in use), the periodic sync's next look when
  it found nothing newer than the remote's to sync (a run's first checkpoint not saved yet).

Only this process is patched: the trainer it launches is the one it would launch. supervisor_helpers.start_supervisor
runs it when given `quick`.
"""
from __future__ import annotations

import os

STARTUP_GRACE_ENV, READ_AGAIN_ENV, RELIST_ENV = "TEST_STARTUP_GRACE_S", "TEST_READ_AGAIN_AFTER_S", "TEST_RELIST_AFTER_S"
STAGING_COPY_ENV, SYNC_LOOK_AGAIN_ENV = "TEST_STAGING_COPY_FIRST_S", "TEST_SYNC_LOOK_AGAIN_S"

if __name__ == "__main__":
    from minilmd.cli import main
    from minilmd.daemon.child import trainerwatch
    from minilmd.daemon.jobs import fetch, staging, stagingfetch, syncworker

    if STARTUP_GRACE_ENV in os.environ:
        trainerwatch.STARTUP_GRACE_S = float(os.environ[STARTUP_GRACE_ENV])
    if READ_AGAIN_ENV in os.environ:
        pauses = tuple(float(s) for s in os.environ[READ_AGAIN_ENV].split(","))
        assert len(pauses) == len(fetch.READ_AGAIN_AFTER_S), (pauses, fetch.READ_AGAIN_AFTER_S)
        fetch.READ_AGAIN_AFTER_S = pauses
    if RELIST_ENV in os.environ:
        stagingfetch.RELIST_AFTER_S = float(os.environ[RELIST_ENV])
    if STAGING_COPY_ENV in os.environ:
        assert staging.stage.__kwdefaults__ is not None  # its keyword-only defaults, bound when it was defined
        staging.stage.__kwdefaults__["backoff_s"] = float(os.environ[STAGING_COPY_ENV])
    if SYNC_LOOK_AGAIN_ENV in os.environ:
        syncworker.LOOK_AGAIN_S = float(os.environ[SYNC_LOOK_AGAIN_ENV])
    main()
