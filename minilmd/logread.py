"""Reading logs that lie where another user or run may write (a run directory, a shared one): `tail_lines` (the end
of a log, bounded memory), `stream_lines` (a log's last bytes line by line, one block in memory at a time) and
`new_lines` (follow a log). Each is opened as untrusted.open_regular opens one (no link followed, no FIFO or device
ever opened, so no open blocks: Unreadable) and read only from its end, at most max_bytes, so no file (a sparse one
of terabytes) is read unbounded. Torch-free; the supervisor and `minilmd status` import it.
"""
from __future__ import annotations

import os
from collections.abc import Collection, Iterator

from minilmd.untrusted import Unreadable, open_regular

TAIL_MAX_BYTES = 1 << 20
"""The most of a log's or metrics.jsonl's end that is read for its last lines by default."""
NEW_LINES_MAX_BYTES = 16 << 20
"""The most that one read of a followed file (metrics.jsonl, a log) takes in: what was appended beyond that since
the last read is skipped, never held (a file someone made huge, or a sparse one of gigabytes)."""
TAIL_BLOCK = 64 * 1024
"""The first block read back from a file's end; each next one is twice as big (to 8 MiB), so the last few lines of
a big log cost one small read and a whole window few."""


def open_regular_or_none(path: str | os.PathLike, owner: int | Collection[int] | None = None,
                         dir_fd: int | None = None) -> int | None:
    """A descriptor of the regular file at path (untrusted.open_regular: of `owner` when given; with `dir_fd`, path is
    a name in that open directory), None when there is none; Unreadable when it is not one. The caller closes it."""
    try:
        return open_regular(path, owner=owner, dir_fd=dir_fd)
    except Unreadable as e:
        if e.missing:
            return None
        raise


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = os.pread(fd, min(size - got, 1 << 20), offset + got)
        if not chunk:
            break  # truncated meanwhile
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def tail_lines(path: str | os.PathLike, n: int, max_bytes: int = TAIL_MAX_BYTES,
               owner: int | Collection[int] | None = None, dir_fd: int | None = None) -> tuple[list[str], int]:
    """(the last n lines of a file, the file's size when read): read backwards from the end in blocks, at most
    max_bytes, so memory stays bounded however large the log. Fewer lines when the file has fewer (or they do not
    fit in max_bytes); an unfinished last line counts as a line. ([], 0) for a missing file; Unreadable for one
    that is not a regular file (never opened), not `owner`'s when given, or that fails while read (kind "io").
    `dir_fd`: path is a name in that open directory (open_regular)."""
    fd = open_regular_or_none(path, owner, dir_fd)
    if fd is None:
        return [], 0
    try:
        size = end = os.fstat(fd).st_size
        blocks, newlines, block = [], 0, TAIL_BLOCK
        while end > 0 and newlines <= n and size - end < max_bytes:
            start = max(0, end - min(block, max_bytes - (size - end)))
            data = _pread_all(fd, end - start, start)
            if len(data) < end - start:
                break  # truncated meanwhile: what was read before is the tail there was
            blocks.append(data)
            newlines += data.count(b"\n")
            end, block = start, min(block * 2, 8 << 20)
    except OSError as e:
        raise Unreadable(f"cannot be read: {e.strerror or e}", path, os_error=e) from None
    finally:
        os.close(fd)
    lines = b"".join(reversed(blocks)).decode(errors="replace").splitlines()
    if end > 0 and lines:
        lines = lines[1:]  # the first one is cut: it began before what was read
    return (lines[-n:] if n > 0 else []), size


STREAM_BLOCK = 1 << 20
"""What stream_lines holds of a file at a time (and the longest line it returns whole: a longer one is skipped)."""


def stream_lines(path: str | os.PathLike, max_bytes: int) -> Iterator[bytes]:
    """The whole lines of a file's last max_bytes, in file order, read forwards one STREAM_BLOCK at a time: memory
    stays one block however big the file, for a reader that keeps a bounded summary of what it reads (a line longer
    than a block is skipped, the first one cut by the window too). Nothing for a missing file; Unreadable, on the
    first line asked for, for one that is not a regular file or that fails while read."""
    fd = open_regular_or_none(path)
    if fd is None:
        return
    try:
        size = os.fstat(fd).st_size
        offset = max(0, size - max_bytes)
        # a window's first line began before it, unless the byte before the window ends a line
        rest, skipping = b"", offset > 0 and os.pread(fd, 1, offset - 1) != b"\n"
        while offset < size:
            data = os.pread(fd, min(STREAM_BLOCK, size - offset), offset)
            if not data:
                break  # truncated meanwhile: what was read is what there was
            offset += len(data)
            lines = (rest + data).split(b"\n")
            rest = lines.pop()
            if len(rest) > STREAM_BLOCK:
                rest, skipping = b"", True  # no line of ours is that long: drop it, and its end in the next block
            for line in lines:
                if skipping:
                    skipping = False
                    continue
                yield line
        if rest and not skipping:
            yield rest  # an unfinished last line (a writer killed mid-line): the caller's parse decides
    except OSError as e:
        raise Unreadable(f"cannot be read: {e.strerror or e}", path, os_error=e) from None
    finally:
        os.close(fd)


def new_lines(path: str | os.PathLike, offset: int, max_bytes: int = NEW_LINES_MAX_BYTES,
              owner: int | Collection[int] | None = None, dir_fd: int | None = None) -> tuple[list[bytes], int]:
    """(complete lines added since `offset`, the offset after the last of them): follows a file another process
    appends to, never returning the half line it is writing, and never more than the last max_bytes of what was
    added (the rest is skipped). A file that shrank (rotated, truncated) is read from its start again; a missing
    one gives ([], offset); Unreadable as for tail_lines (`owner`, `dir_fd` too)."""
    fd = open_regular_or_none(path, owner, dir_fd)
    if fd is None:
        return [], offset
    try:
        size = os.fstat(fd).st_size
        offset = 0 if size < offset else offset
        skipped = size - offset > max_bytes
        if skipped:
            offset = size - max_bytes
        data = _pread_all(fd, size - offset, offset)
    except OSError as e:
        raise Unreadable(f"cannot be read: {e.strerror or e}", path, os_error=e) from None
    finally:
        os.close(fd)
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    lines = data[:end].splitlines()
    return (lines[1:] if skipped else lines), offset + end + 1  # after a skip the first line is cut
