"""How staging fails, shared by the corpus staging (daemon/jobs/staging.py) and the staging of the probe and
init.from (daemon/jobs/initstage.py), and told apart by the supervisor (daemon/infra.py): retry later, or final.
Torch-free."""
from __future__ import annotations


class StagingError(RuntimeError):
    """Staging failed; the message says what, where and with which numbers. Worth retrying later."""


class ScratchTooSmall(StagingError):
    """The corpus does not fit in scratch: retrying cannot make room; a config error (run.scratch), final (2)."""


class SourceInvalid(StagingError):
    """The source is not a usable prepared corpus (no meta.json, wrong format, broken invariants): retrying will
    not help; this is a data error (final)."""
