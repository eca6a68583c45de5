"""How staging fails, shared by the corpus staging (daemon/jobs/staging.py) and the staging of the probe and
init.from (daemon/jobs/initstage.py), and told apart by the supervisor (daemon/infra.py, daemon/jobs/stagingworker.py):
waited for, retried later (counted), or final. The rule: what cannot be read now, and a scratch without room now
that has the capacity, are waited for without limit; what is read and wrong, or can never fit, is final.
Torch-free."""
from __future__ import annotations


class StagingError(RuntimeError):
    """Staging failed; the message says what, where and with which numbers. Worth retrying later (each failure
    counts towards restart.no_progress_limit)."""


class SourceUnreachable(StagingError):
    """A source (the corpus, the probe corpus, init.from) cannot be read now: gone, an I/O error, a stale or
    timed-out mount. Not a failure of the run: waited for, retried with backoff for as long as it takes."""


class ProbeUnreachable(SourceUnreachable):
    """The probe corpus ([eval] probe) cannot be read now: waited for as any source, and said as the probe's, not
    init.from's (status: "probe source unreachable")."""


class ScratchFull(StagingError):
    """The corpus does not fit in scratch now, but would if what others hold there (or, on a RAM disk, in memory)
    were freed: another job took the space. Waited for like a source that cannot be read; never counted."""


class ScratchTooSmall(StagingError):
    """The corpus can never fit in scratch (its filesystem, or on a RAM disk the machine's memory less the
    headroom, is too small): retrying cannot make room; a config error (run.scratch), final (2)."""


class SourceInvalid(StagingError):
    """The source is not a usable prepared corpus (no meta.json, wrong format, broken invariants): retrying will
    not help; this is a data error (final)."""
