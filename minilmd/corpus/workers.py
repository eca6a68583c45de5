"""The worker processes of the corpus tools (prepare's encoders, corpus report's and count's scan, tokenizer
train's training process): how many by default, how they start, and that they start deaf to the Ctrl-C their parent
handles and die with it. A pool of them is a WorkerPool, the one way they are started (a ProcessPoolExecutor made
elsewhere would start its workers hearing Ctrl-C: a traceback from each, and one of a truncated pickle). Here alone
the code names multiprocessing (tokenizer train's process is one of spawn_context's): its spawn starts Pythons
outside minilmd/pychild.py, and tests/test_one_way_to_start_python.py lists any other use."""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor


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

    held = {signal.Signals[name] for name in STOP_SIGNALS}
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
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.Signals[name] for name in STOP_SIGNALS})


def die_with_parent(parent: int) -> None:
    """Make the kernel SIGKILL this worker when its parent's process ends, however it ends: a parent killed with
    SIGKILL has no chance to stop its pool, and its workers would go on (and keep multiprocessing's resource tracker
    alive, which ends by itself once no process holds its pipe). PR_SET_PDEATHSIG is Linux's; if the parent already
    ended before the call, exit at once. Elsewhere a no-op."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def start_worker(parent: int) -> None:
    """First thing in a worker process started under stop_signals_held: deaf to Ctrl-C, dead with `parent`."""
    worker_ignores_interrupts()  # the parent handles Ctrl-C and ends the workers
    die_with_parent(parent)


def _pool_worker_init(parent: int, initializer: Callable | None, initargs: tuple) -> None:
    start_worker(parent)
    if initializer is not None:
        initializer(*initargs)


class WorkerPool(ProcessPoolExecutor):
    """`workers` spawned processes that start as start_worker says, then run `initializer(*initargs)`. The pool
    spawns its workers in submit(), so submit holds the stop signals (stop_signals_held). Leave it by close(), in a
    finally: pending tasks cancelled, the running ones finished (their workers ignore the Ctrl-C)."""

    def __init__(self, workers: int, initializer: Callable | None = None, initargs: tuple = ()):
        super().__init__(workers, mp_context=spawn_context(), initializer=_pool_worker_init,
                         initargs=(os.getpid(), initializer, initargs))

    def submit(self, fn, /, *args, **kwargs) -> Future:
        with stop_signals_held():
            return super().submit(fn, *args, **kwargs)

    def close(self) -> None:
        # A stop (SIGTERM raises KeyboardInterrupt) that lands inside submit() while the pool starts its manager
        # thread leaves that thread not yet marked started, and joining it raises RuntimeError: the interrupt then
        # ended as a traceback, not as the command's exit 130. Asked again once the thread has marked itself started,
        # the pool shuts down cleanly; the workers die with this process in any case (PR_SET_PDEATHSIG).
        deadline = time.monotonic() + 5
        while True:
            try:
                self.shutdown(wait=True, cancel_futures=True)
                return
            except RuntimeError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.05)
