"""The supervisor waits (bounded) for the last attempt's SIGKILLed processes to be gone before the next launch
(review10d F1a): a rank 0 stuck in the kernel still holds trainer.lock. minilmd/procs.py wait_gone, with a fake
of the processes' liveness (a real process stuck in uninterruptible sleep is not made on demand)."""
from __future__ import annotations

import ast

import source_tree
from minilmd.procs import wait_gone


class DiesAfter:
    """A fake process_alive: each (pid, ticks) is alive for its first `looks` looks."""

    def __init__(self, looks: dict[int, int]):
        self.looks = looks
        self.fed = 0

    def __call__(self, pid: int, ticks: int) -> bool:
        self.looks[pid] -= 1
        return self.looks[pid] >= 0

    def feed(self) -> None:
        self.fed += 1


def test_processes_that_end_within_the_bound_are_waited_for_and_the_watchdog_fed():
    alive = DiesAfter({11: 3, 12: 1})
    assert wait_gone([(11, 100), (12, 200)], 600, alive.feed, alive=alive, interval=0) == []
    assert alive.fed >= 3


def test_a_process_that_survives_the_bound_is_named():
    alive = DiesAfter({11: 10**9, 12: 0})
    assert wait_gone([(11, 100), (12, 200)], 0, alive=alive, interval=0) == [11]


def test_no_loop_outside_procs_waits_on_process_alive():
    """The one wait for processes to be gone is procs.wait_gone: a `while` that asks process_alive elsewhere is a
    second copy of it (before: daemon/child/orphans.py's _poll_until_gone beside process.py's wait_gone)."""
    loops = []
    for path in source_tree.audited_files():
        rel = source_tree.relative(path)
        if rel == "minilmd/procs.py":
            continue
        for node in ast.walk(source_tree.tree(path)):
            asks = (isinstance(call, ast.Call) and "process_alive" in ast.unparse(call.func) for call in ast.walk(node))
            if isinstance(node, ast.While) and any(asks):
                loops.append(f"{rel}:{node.lineno}")
    assert not loops, loops
