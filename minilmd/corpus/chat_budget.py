"""The bounds of a chat template's rendering (chat_sandbox.py's module docstring says what they bound and why).

TemplateLimits: the CPU seconds of one conversation's renderings (`seconds`, plus `seconds_per_message` for each
message rendered) and the longest string, list or output (`chars`). Budget: those limits for one compiled template
and the bound under way, checked by the sandbox at every call, operator, filter and output piece. `limited()`: the
block the renderings run in, with an ITIMER_PROF alarm in a process's main thread for a loop that calls nothing
(again after it raised, until the block is left: Python loses an exception raised in a gc callback or a __del__).
A rendering beyond a bound raises Exceeded (a BaseException: neither jinja2 nor the template can swallow it).
"""
from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class TemplateLimits:
    seconds: float = 2.0
    """CPU seconds all renderings of one conversation may take together, beside seconds_per_message."""
    chars: int = 1 << 20
    """The longest string, list or output a rendering may build (characters or elements)."""
    seconds_per_message: float = 1e-3
    """CPU seconds more for each message rendered (MiniMind's template takes 11-40 us per message: about 30-90x
    that), so that a long conversation, and the prefix renderings of one (chat.py), are allowed their size."""


ALARM_AGAIN_S = 0.05
"""CPU seconds after an alarm that raised, its next one, until the bounded block is left (`limited`): far more
than the raise takes to leave the block, so that it never lands in the block's clean-up."""


class Exceeded(BaseException):
    """A rendering went beyond its TemplateLimits; the message says which bound."""


class Budget:
    """The limits of one compiled template and the bound of the renderings under way: CPU seconds of the rendering
    thread (module docstring)."""

    def __init__(self, limits: TemplateLimits):
        self.limits = limits
        self.active = False
        self.cpu_deadline = self.wall_deadline = float("inf")
        self.allowed = 0.0
        self.messages = 0

    def begin(self) -> None:
        """A bound starts: `seconds` of CPU time from now."""
        self.allowed, self.messages = self.limits.seconds, 0
        self.cpu_deadline = time.thread_time() + self.allowed
        self.wall_deadline = time.monotonic() + self.allowed
        self.active = True

    def allow(self, messages: int) -> None:
        """A rendering of `messages` messages starts: the bound grows by their allowance."""
        more = self.limits.seconds_per_message * messages
        self.messages += messages
        self.allowed += more
        self.cpu_deadline += more
        self.wall_deadline += more

    def left(self) -> float:
        """CPU seconds left before the bound (<= 0: beyond it)."""
        return self.cpu_deadline - time.thread_time()

    def check_time(self) -> None:
        if self.active and time.monotonic() > self.wall_deadline:  # the wall clock first: CPU time cannot be ahead
            left = self.left()
            if left < 0:
                raise Exceeded(self.over())
            self.wall_deadline = time.monotonic() + left

    def over(self) -> str:
        return (f"rendering took more than {self.allowed:.3g} CPU s, its bound for {self.messages:,} messages "
                f"rendered ({self.limits.seconds:g} s + {self.limits.seconds_per_message * 1e3:g} ms per message)")

    def check_size(self, n: int, what: str = "a value") -> None:
        if n > self.limits.chars:
            raise Exceeded(f"{what} of {n:,} characters or elements, more than the {self.limits.chars:,} allowed")

    def check_result(self, value) -> None:
        if isinstance(value, (str, list, tuple, dict, set, bytes)):
            self.check_size(len(value))

    def check_tree(self, value) -> int:
        """The number of elements of value counted as a tree (shared parts counted each time); Exceeded beyond
        the bound. Linear in the distinct objects (their counts are memoized)."""
        if not isinstance(value, (list, tuple, dict, set, frozenset)):  # the usual case, at once
            n = 1 + len(value) if isinstance(value, str) else 1
            self.check_size(n, "a value")
            return n
        memo: dict[int, int] = {}

        def size(v) -> int:
            if isinstance(v, str):
                return 1 + len(v)
            if not isinstance(v, (list, tuple, dict, set, frozenset)):
                return 1
            if id(v) in memo:
                return memo[id(v)]
            memo[id(v)] = self.limits.chars + 1  # a container that holds itself: too big
            items = [x for kv in v.items() for x in kv] if isinstance(v, dict) else v
            n = 1
            for x in items:
                n += size(x)
                if n > self.limits.chars:
                    break
            memo[id(v)] = n
            return n

        n = size(value)
        self.check_size(n, "a value")
        return n


@contextmanager
def limited(budget: Budget):
    """Bound the renderings inside the block by budget.limits (re-entrant: an inner block is the outer's)."""
    if budget.active:
        yield
        return

    def on_alarm(signum, frame):
        if not budget.active:  # the block's clean-up has begun: no alarm lands in it
            return
        left = budget.left()
        if left > 0:  # the process's CPU time (other threads' too) ran ahead of the thread's: not yet
            signal.setitimer(signal.ITIMER_PROF, max(left, 1e-3))
            return
        # again until the block is left: an Exceeded raised where Python only reports it (a gc callback, a __del__,
        # a weakref callback the alarm landed in) is lost, and a loop that calls nothing would then run for ever
        signal.setitimer(signal.ITIMER_PROF, ALARM_AGAIN_S)
        raise Exceeded(budget.over())

    alarm = threading.current_thread() is threading.main_thread()
    old_handler = None
    started = time.process_time()
    budget.begin()
    try:
        if alarm:
            old_handler = signal.signal(signal.SIGPROF, on_alarm)
            old_delay, old_interval = signal.setitimer(signal.ITIMER_PROF, budget.limits.seconds)
        yield
    finally:
        budget.active = False
        if old_handler is not None:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, old_handler)
            if old_delay:  # someone else's timer: give it back what is left of it
                signal.setitimer(signal.ITIMER_PROF, max(old_delay - (time.process_time() - started), 1e-3),
                                 old_interval)

