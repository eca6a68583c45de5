"""Reading an open descriptor up to a bound: the one loop behind untrusted.read_open (every hardened read of a file
another user may write), mounts.read_mounts (/proc/self/mountinfo) and proc_info's /proc status reads. A /proc file
says its size is 0, and a regular file may grow after its fstat, so the loop reads to the end of what is there, one
byte past the bound at most: a caller tells "over the bound" by that one byte, never by a read cut short. Standard
library only (mounts.py and proc_info.py sit below every other module of minilmd).
"""
from __future__ import annotations

import os


def read_past_bound(fd: int, max_bytes: int) -> bytes:
    """What `fd` holds from its offset, at most max_bytes + 1 bytes: longer than max_bytes means over the bound.
    OSError as os.read raises it."""
    chunks, got = [], 0
    while got <= max_bytes:
        chunk = os.read(fd, max_bytes + 1 - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
