"""Whether anything at all was written in a directory while a test ran: `DirWatch(path)` holds an inotify watch on it
(through libc, no package) and `changes()` says each change the kernel saw, a file made and removed again at once
included, which a listing afterwards never shows; `look(path)` is what a listing and the directory's own times say.
Changes made through a FUSE mount are seen on the directory it passes them to (tests/faultfs.py's backing)."""
from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

CHANGES = {0x2: "MODIFY", 0x4: "ATTRIB", 0x8: "CLOSE_WRITE", 0x40: "MOVED_FROM", 0x80: "MOVED_TO", 0x100: "CREATE",
           0x200: "DELETE", 0x400: "DELETE_SELF", 0x800: "MOVE_SELF"}
"""The inotify events that change a directory or an entry of it (opening or listing it, which a look does, is none)."""

EVENT = struct.Struct("iIII")


class DirWatch:
    def __init__(self, path: str | os.PathLike):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = sum(CHANGES)
        if libc.inotify_add_watch(self.fd, os.fsencode(path), mask) < 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, "inotify_add_watch", str(path))
        self.seen: list[str] = []

    def changes(self) -> list[str]:
        """Every change seen since the watch began, as "CREATE name" (the entry's name, "" for the directory)."""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return list(self.seen)
            at = 0
            while at < len(data):
                _, mask, _, size = EVENT.unpack_from(data, at)
                name = data[at + EVENT.size:at + EVENT.size + size].rstrip(b"\0").decode(errors="replace")
                self.seen += [f"{what} {name}" for bit, what in CHANGES.items() if mask & bit]
                at += EVENT.size + size

    def __enter__(self) -> DirWatch:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def look(path: Path) -> tuple:
    """What a directory shows: its entries, its own modification and change times (ns), mode and owner."""
    st = os.lstat(path)
    return sorted(os.listdir(path)), st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid
