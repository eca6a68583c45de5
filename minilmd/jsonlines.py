"""The run's JSON-lines files as every process appends to and reads them (metrics.jsonl, the trainer's; events.jsonl
and supervisor.log, the supervisor's; the --fresh marker in metrics.jsonl, daemon/base/timeline.py): how they are
opened, a line appended whole or not at all, a torn last line ended, and the records read back from their lines.
The one way to append into run.dir (tests/test_shared_write_audit.py fails a plain open() for writing there). In the
core, so that the trainer (minilmd/metrics.py) and the supervisor append the same way. Torch-free.
"""
from __future__ import annotations

import errno
import os
import stat

from minilmd.openflags import NO_FOLLOW_NO_BLOCK
from minilmd.untrusted import MAX_LINE_DEPTH, Unreadable, file_kind, loads

LOG_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | NO_FOLLOW_NO_BLOCK
"""How the run's logs are opened to append: a link at their name is an error (ELOOP), never appended through, a FIFO
no hang (run.dir is held to the place rule, minilmd/place_rule.py run_dir_problem: the second guard)."""
LOG_UPDATE = LOG_APPEND & ~os.O_WRONLY & ~os.O_CREAT | os.O_RDWR
"""LOG_APPEND read-write and without O_CREAT: a log that is there, its last byte read (end_torn_line)."""


class NotALog(OSError):
    """A run log's name holds something else than a regular file (a link, a FIFO, a directory): never written
    through; its words say what was found."""


def open_log(path: str | os.PathLike, flags: int = LOG_APPEND, mode: int = 0o644) -> int:
    """`path` opened with `flags` (LOG_APPEND or LOG_UPDATE), a regular file or NotALog: a link refused unopened
    (O_NOFOLLOW), a FIFO opened without waiting (O_NONBLOCK) and refused, closed. FileNotFoundError without
    O_CREAT when there is none; any other OSError as it is (ENOSPC, EACCES)."""
    try:
        fd = os.open(path, flags, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotALog(errno.ELOOP, "a symbolic link: not written through", str(path)) from None
        if e.errno == errno.ENXIO:  # a FIFO with no reader, opened write-only without waiting
            raise NotALog(errno.ENXIO, "a FIFO, not a regular file: not written", str(path)) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotALog(errno.EINVAL, f"{file_kind(st.st_mode)}, not a regular file: not written", str(path))
    return fd


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


def torn(fd: int) -> bool:
    """Whether the log open read-write at `fd` ends in a torn line (a writer killed mid-line: no newline last)."""
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def append_line(path: str | os.PathLike, line: bytes) -> None:
    """`line` (one JSON object and its newline) appended whole to the log at `path` (open_log), made when there is
    none. Raises NotALog, or the OSError of a write that failed (nothing of it left)."""
    fd = open_log(path)
    try:
        append_whole(fd, line)
    finally:
        os.close(fd)


def end_torn_line(path: str | os.PathLike) -> None:
    """A newline after the log's last line when it was torn (a writer killed mid-line), so that the next line is one
    of its own; nothing when there is no log. Raises NotALog, or the OSError of a write that failed."""
    try:
        fd = open_log(path, LOG_UPDATE)
    except FileNotFoundError:
        return
    try:
        if torn(fd):
            append_whole(fd, b"\n")
    finally:
        os.close(fd)


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
