"""The run's JSON-lines files as the supervisor appends to and reads them (events.jsonl, supervisor.log,
metrics.jsonl): how they are opened, a line appended whole or not at all, and the records read back from their lines.
Apart from daemon/base/runstate.py so that daemon/base/timeline.py, which runstate uses, can append its marker the
same way. Torch-free.
"""
from __future__ import annotations

import errno
import os

from minilmd.untrusted import MAX_LINE_DEPTH, Unreadable, loads

LOG_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""How events.jsonl and supervisor.log are opened: a link at their name is an error (ELOOP), never appended
through, a FIFO no hang (run.dir is held to the place rule, minilmd/place_rule.py run_dir_problem: the second
guard)."""


def append_whole(fd: int, data: bytes) -> None:
    """Append all of data or nothing: a disk that fills in the middle of a line must not leave half of it, which
    would spoil the line appended after it once there is room again."""
    start = os.fstat(fd).st_size
    try:
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError:
        os.ftruncate(fd, start)
        raise


def json_records(lines: list[bytes] | list[str]) -> list[dict]:
    """The JSON objects among lines of a JSON-lines file (depth-bounded: minilmd/untrusted.py `loads`); a torn or
    foreign line is skipped."""
    records = []
    for line in lines:
        try:
            records.append(loads(line, max_depth=MAX_LINE_DEPTH, expect=dict))
        except Unreadable:
            continue  # a torn line from a trainer killed mid-write: skip it, the next one is whole
    return records
