"""The one exponential backoff: the restart of a trainer or of staging (restart.backoff_*), a failed sync, a staging
copy retried. Each caller names its figures here or in its config section, and says whether it needs a cap (a wait
that must not grow past a bound: sync.every, restart.backoff_max) and a jitter (several runs that failed together, a
node-wide NFS stall, must not come back in lockstep). docs/architecture.md, operations.md and failure-modes.md quote
these figures (tests/test_backoff.py holds them to it). Torch-free.
"""
from __future__ import annotations

import random

SYNC_RETRY_FIRST_S = 5.0
"""A failed sync is retried after 5 s, 10 s, 20 s ... capped at sync.every (daemon/jobs/syncworker.py); no jitter:
a run's syncs do not come back in lockstep with other runs', each retries at its own failure."""
STAGING_COPY_RETRIES = 3
"""A staged file whose copy failed or came out short or wrong is copied again this many times (daemon/jobs/staging.py),
then its source is unreachable (waited for with the restart backoff) or the staging failed."""
STAGING_COPY_FIRST_S = 1.0
"""The wait before the first copy retried; doubled before each next one (1 s, 2 s, 4 s)."""
STAGING_COPY_MAX_S = 60.0
"""The longest wait between two tries of a copy, whatever the retries asked for: the staging thread holds no more."""
JITTER_LOW = 0.5
"""With a jitter, a wait is its exponential figure times a uniform factor in [JITTER_LOW, 1]."""


def exponential(first_s: float, n: int, cap_s: float | None = None, rng: random.Random | None = None) -> float:
    """The wait before the n-th retry (n >= 1; a smaller n counts as 1): first_s * 2^(n-1), at most cap_s (when
    given), then times a jitter in [JITTER_LOW, 1] drawn from rng (when given)."""
    wait = first_s * 2.0 ** min(max(1, n) - 1, 64)  # a sync failing for days counts past 2^1024: no overflow
    if cap_s is not None:
        wait = min(cap_s, wait)
    if rng is not None:
        wait *= JITTER_LOW + (1.0 - JITTER_LOW) * rng.random()
    return wait
