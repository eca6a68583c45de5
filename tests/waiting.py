"""Waiting in tests: on a condition, with a deadline, never a bare sleep standing in for a proof."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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
