"""How many OpenMP threads a process that trains gets (OMP_NUM_THREADS), and why: the one home of the rule, used by
the supervisor for the trainers it launches (daemon/child/process.py `trainer_threads`) and by the benches that
time the trainer's step (trainer/bench/packing.py, sft.py), so that a bench measures the step a run takes.

A value set in the environment is never overridden. A process whose CPU work is a Python host loop (a torchrun rank,
a GPU trainer) gets 1: threads do not speed that loop up, they only contend with the other ranks and with other
users' jobs. A single CPU trainer gets the cores that are idle now: all it may run on less the 1-minute load
average, at least 1. OpenMP threads on cores that other work keeps busy are far slower than one thread
(docs/training.md, CPU threads: 2 threads ran at 0.06-0.31x of 1 on a loaded 2-core host). Torch-free.
"""
from __future__ import annotations

import os
from collections.abc import Mapping


def one_thread_reason(gpu: bool, ranks: bool) -> str | None:
    """Why a trainer gets one thread (None: a single CPU trainer, which gets the idle cores): on a GPU, or one of
    several torchrun ranks on this host. The supervisor (a GPU in CUDA_VISIBLE_DEVICES, a torchrun command) and
    `minilmd train` on its own (its device, LOCAL_WORLD_SIZE) ask it with what each knows."""
    if gpu:
        return "a GPU trainer: its host loop is one thread"
    return "one thread per torchrun rank" if ranks else None


def trainer_threads(environ: Mapping[str, str], set_for: str, one_thread: str | None = None,
                    cores: int | None = None, load: float | None = None) -> tuple[str, str]:
    """(OMP_NUM_THREADS, why). `set_for` names whom a value in `environ` was set for; `one_thread` says why this
    process gets one thread (None: a single CPU trainer). `cores` and `load`: this process's CPUs and the 1-minute
    load average (None: read now)."""
    if environ.get("OMP_NUM_THREADS"):
        value = environ["OMP_NUM_THREADS"]
        return value, f"OMP_NUM_THREADS={value} in the environment of {set_for}, kept"
    if one_thread is not None:
        return "1", one_thread
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    load = os.getloadavg()[0] if load is None else load
    idle = min(cores, round(cores - load))
    if idle < 1:  # an overloaded host: one thread, never none
        return "1", f"a single CPU trainer: none of {cores} cores idle (load average {load:.1f}), so 1"
    return str(idle), f"a single CPU trainer: {idle} of {cores} cores idle (load average {load:.1f})"
