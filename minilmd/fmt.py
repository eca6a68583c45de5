"""Numbers for humans: how long something took or has lasted, and how large something is, in the status screen,
logs and GPU reports; and when, and how a look at shared storage that does not answer is said."""
from __future__ import annotations

import time


def fmt_time(ts: float | None) -> str:
    """"2026-12-07 18:14:39" in local time; "-" for None (or 0: never)."""
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def not_answering(what: str, since: float | None) -> str:
    """"init.from /nfs/base not answering since T (stalled)": the one home of how a source whose looks block (a hung
    share: no error, no answer) is said, by staging's log line and state.json (daemon/jobs/stagingworker.py),
    `status` (daemon/views/status.py) and the launch's early line (minilmd/probes.py)."""
    return f"{what} not answering since {fmt_time(since)} (stalled)"


def fmt_duration(seconds: float | None) -> str:
    """"45s", "12m", "3.5h", "2.1d"; "-" for None. Negative durations (clock skew) read as 0s."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f}m"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def fmt_mb(n: float | None) -> str:
    """Bytes in decimal megabytes, "1,234.5 MB"; "?" for None (a size not known)."""
    return "?" if n is None else f"{n / 1e6:,.1f} MB"


def fmt_times(n: int) -> str:
    """How many times something was done, as words: "once", "twice", "3 times" (never "1 times")."""
    return {1: "once", 2: "twice"}.get(n, f"{n:,} times")
