"""Where a run's supervisor is, whether it runs, and how that is known: the one rule, daemon/base/seen.py, by the
name status, the overview and the other views import it (the supervisor's wait for its init.from predecessor,
daemon/phases/initwait.py, asks it too, from below the views). Torch-free.
"""
from __future__ import annotations

from minilmd.daemon.base.seen import LOCK, OTHER_HOST, RECORD, STATE_WORDS, Seen, lock_table, supervisor_seen

__all__ = ["LOCK", "OTHER_HOST", "RECORD", "STATE_WORDS", "Seen", "lock_table", "supervisor_seen"]
