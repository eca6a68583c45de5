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
    """What a worker thread reads on shared storage ("" while nothing) and when a read of it last returned. Written
    by the thread, read by the loop: each is one attribute store, `answered` first, so the loop never pairs a new
    source with an old time."""

    def __init__(self):
        self.answered = now()
        self.what = ""

    def reading(self, what: str) -> None:
        """Now reading `what` ("": nothing on shared storage any more)."""
        self.answered = now()
        self.what = what

    def answer(self) -> None:
        """A read of it returned (a chunk copied)."""
        self.answered = now()


def error_words(e: BaseException) -> str:
    """A failed sync in words for status and the logs, no Python class name: an OSError's own ("[Errno 2] No such
    file or directory: '/nfs/x'"), minilmd's own errors' messages (daemon/jobs/sync.py SyncError names the
    checkpoint, the remote and the cause); the class name only of anything else (a bug's, which it helps find)."""
    if isinstance(e, OSError) or type(e).__module__.startswith("minilmd."):
        return str(e)
    return f"{type(e).__name__}: {e}"
