"""Waiting in tests: on a condition, with a deadline, never a bare sleep standing in for a proof; and a call that
must not block, bounded so that a regression fails the test instead of hanging it."""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 60, what: str = "condition",
               interval: float = 0.1) -> T:
    """The first truthy value of predicate(), polled every interval seconds; AssertionError naming `what` if
    none came within timeout seconds. The predicate is also tried once more at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def without_blocking(call: Callable[[], T], fifo: Path | None = None, bound: float = 120) -> T:
    """call() in a thread: its result, or its exception raised again here. If it is still running after `bound`
    seconds (a FIFO opened, /dev/zero read, a link followed to either), the test fails, after opening `fifo` for
    writing when given, so that the blocked thread ends too. The bound is on a hang, not a timing assertion: a
    regression never returns."""
    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=bound)
    if thread.is_alive():
        if fifo is not None and fifo.exists():
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"{call} blocked (a FIFO opened, /dev/zero read, a link followed to either?)")
    if "error" in out:
        raise out["error"]
    return out["value"]
