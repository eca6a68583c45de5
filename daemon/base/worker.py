"""A blocking job in a daemon thread that the supervisor's loop polls, and the inbox through which such threads
hand their log lines to the loop.

Staging, a remote fetch and a sync may block for minutes on a stalled NFS. Each runs as a `Worker`; the loop looks
at `done` every tick and reads `result` or `error` once it is, so the loop, the heartbeat check and the trainer never
wait for the remote. Only the loop writes events: a thread puts its messages into an `Inbox` and the loop emits them.
A `ReadWatch` says what a thread reads on shared storage and when a read last returned, so that the loop can tell
a stalled source from a slow one. Torch-free.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from minilmd.daemon.base.runstate import now
from minilmd.fmt import fmt_mb


class Worker:
    """`fn()` in a daemon thread; `done`, then `result` or `error` (and `error_text`, for logs and status)."""

    def __init__(self, name: str, fn: Callable[[], object]):
        self.name = name
        self.started = now()
        self.result: Any = None  # whatever fn returns; its reader knows the job
        self.error: BaseException | None = None
        self.error_text = ""
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self.result = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the loop, which decides
            self.error = e
            self.error_text = f"{type(e).__name__}: {e}"

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout_s: float) -> bool:
        """Whether it ended within `timeout_s` (tests: the loop itself only looks at `done`)."""
        self._thread.join(timeout_s)
        return self.done

    def running_for(self) -> float:
        return now() - self.started


class Inbox:
    """Messages from worker threads, emitted by the loop as "info" events (deque appends and pops are atomic)."""

    def __init__(self, emit: Callable[..., None]):
        self._emit = emit
        self._messages: deque[str] = deque()

    def put(self, message: str) -> None:
        self._messages.append(message)

    def drain(self) -> None:
        while self._messages:
            self._emit("info", self._messages.popleft())


class ReadWatch:
    """What a worker thread reads or writes on shared storage ("" while nothing), when it last answered (a read
    returned, a chunk was copied or hashed), and the bytes moved since it began `what` (of `total`, when known).
    Written by the thread, read by the loop: each is one attribute store, `answered` first, so the loop never pairs
    a new source with an old time. A job is stalled when nothing answered for its limit (`silent_for`), however long
    it has run: a slow mount that still moves bytes is slow, not stalled (staging's reads, a sync's copy)."""

    def __init__(self):
        self.answered = now()
        self.began = self.answered
        self.what = ""
        self.done = 0
        self.total: int | None = None

    def reading(self, what: str, total: int | None = None) -> None:
        """Now reading (or writing) `what`, `total` bytes of it if known ("": nothing on shared storage any more)."""
        self.answered = self.began = now()
        self.done, self.total = 0, total
        self.what = what

    def answer(self, nbytes: int = 0) -> None:
        """A read of it returned, a chunk copied (`nbytes` of it moved)."""
        self.answered = now()
        self.done += nbytes

    def silent_for(self) -> float:
        """Seconds since it last answered."""
        return now() - self.answered

    def pace(self) -> str:
        """How it moves, in words: "2.5 MB/s, 120.0 MB of 2,400.0 MB copying X" ("" before the first byte)."""
        done, took = self.done, max(now() - self.began, 1e-3)
        if not done:
            return ""
        of = f" of {fmt_mb(self.total)}" if self.total else ""
        return f"{fmt_mb(done / took)}/s, {fmt_mb(done)}{of} {self.what}".rstrip()


def error_words(e: BaseException) -> str:
    """A failed sync in words for status and the logs, no Python class name: an OSError's own ("[Errno 2] No such
    file or directory: '/nfs/x'"), minilmd's own errors' messages (daemon/jobs/sync_errors.py SyncError names the
    checkpoint, the remote and the cause); the class name only of anything else (a bug's, which it helps find)."""
    if isinstance(e, OSError) or type(e).__module__.startswith("minilmd."):
        return str(e)
    return f"{type(e).__name__}: {e}"
