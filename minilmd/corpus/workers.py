"""The worker processes of the corpus tools (prepare's encoders, corpus report's and count's scan): how many by
default, and how they start."""
from __future__ import annotations

import os


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
