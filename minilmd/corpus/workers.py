"""The worker processes of the corpus tools (prepare's encoders, corpus report's and count's scan): how many by
default, how they start, and
that they start deaf to the Ctrl-C their parent handles."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def default_workers() -> int:
    """The CPUs this process may run on (its affinity, as a Slurm or cgroup limit sets it), else all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def spawn_context():
    """spawn, not fork: the parent may hold threads (progress, fsspec) or, inside the trainer, torch state."""
    import multiprocessing

    return multiprocessing.get_context("spawn")


STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
"""What a terminal's Ctrl-C, a closed SSH session or a `kill` sends; a corpus command turns each into
KeyboardInterrupt (minilmd/cli/data.py) and a worker must not (its traceback would follow the command's one line)."""


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Start worker processes inside this: the stop signals are held (blocked) in this thread meanwhile, so that
    (1) a process spawned here starts with them held (a blocked mask survives fork and exec), and a Ctrl-C that
    reaches the whole process group while it imports waits until `worker_ignores_interrupts` drops it, where
    before it raised KeyboardInterrupt in the worker's start (a traceback, and another of the truncated pickle it
    was reading); (2) this process finishes writing the worker's start data before its own KeyboardInterrupt,
    raised as the signals are let through again on leaving. multiprocessing's resource tracker starts the same way."""
    import signal

    held = {getattr(signal, name) for name in STOP_SIGNALS}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def worker_ignores_interrupts() -> None:
    """First thing in a worker started under stop_signals_held: Ctrl-C ignored for good (the parent handles it and
    ends the workers; a held one is dropped here), SIGTERM and SIGHUP let through again at their default (an end
    without a traceback)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {getattr(signal, name) for name in STOP_SIGNALS})
