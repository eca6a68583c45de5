"""Numbers for humans: how long something took or has lasted, and how large something is, in the status screen,
logs and GPU reports."""
from __future__ import annotations


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
