"""torch's intra-op threads by the one rule minilmd/threads.py gives (the supervisor's trainers get it through
OMP_NUM_THREADS): for `minilmd train` on its own, which no supervisor set them for, and for the benches that time
the trainer's step. torch's default, every core, contends with other users' jobs on a shared host and on a loaded
one runs slower than a single thread (docs/training.md, CPU threads)."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

import torch

from minilmd import threads


def choose(device_type: str, what: str, environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(threads, why) for a trainer on `device_type`: OMP_NUM_THREADS set for `what` kept, 1 for a GPU trainer or
    one of several ranks, the idle cores for a single CPU trainer; torch's own count when the value set is none."""
    environ = os.environ if environ is None else environ
    ranks = environ.get("LOCAL_WORLD_SIZE", "1")
    one_thread = threads.one_thread_reason(gpu=device_type != "cpu", ranks=ranks.isdigit() and int(ranks) > 1)
    value, why = threads.trainer_threads(environ, what, one_thread)
    if value.isdigit() and int(value) > 0:
        return int(value), why
    return torch.get_num_threads(), f"OMP_NUM_THREADS={value} is no thread count: torch's own"


@contextlib.contextmanager
def held(device_type: str, what: str) -> Iterator[tuple[int, str]]:
    """torch's threads set by `choose` for the block, torch's own given back after. Yields (threads, why)."""
    before = torch.get_num_threads()
    count, why = choose(device_type, what)
    torch.set_num_threads(count)
    try:
        yield count, why
    finally:
        torch.set_num_threads(before)
