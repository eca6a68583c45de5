"""The signal that killed a torchrun group's first failed rank, read from the agent's failure summary (torch's
ChildFailedError, printed at the end of the attempt log): torchrun itself exits 1 whatever ended its ranks.

The summary lists the ranks the agent stopped (SIGTERM, after the first failure) under "Failures:", then the first
failure under a "Root Cause (first observed failure):" line at the start of a line, its fields in a fixed order:
time, host, rank, `exitcode`, error_file, and last `traceback`, which quotes the rank's recorded error (indented,
one line per line of it). A rank's own output, written before the summary, and the quoted error can hold any text,
"exitcode : -9" included: only the exitcode field of the last such block, read before its error_file and traceback
fields, is the root cause's.
"""
from __future__ import annotations

import re

ROOT_CAUSE = "Root Cause (first observed failure):"
_EXITCODE = re.compile(r"\s+exitcode\s*:\s*(-?\d+)")
_AFTER_EXITCODE = ("error_file", "traceback")


def root_cause_signal(lines: list[str]) -> int | None:
    """The signal number of the root cause's negative exitcode in a log's last lines; None when its rank exited with
    a code, or there is no summary (the run's log not torchrun's, or its tail cut before the header)."""
    stripped = [ln.rstrip() for ln in lines]
    if ROOT_CAUSE not in stripped:
        return None
    start = len(stripped) - 1 - stripped[::-1].index(ROOT_CAUSE)  # it starts its line; a quoted line is indented
    for line in lines[start + 1:]:
        m = _EXITCODE.match(line)
        if m:
            code = int(m.group(1))
            return -code if code < 0 else None
        if line.strip().startswith(_AFTER_EXITCODE):  # past the field: a summary not as torch writes it
            return None
    return None
