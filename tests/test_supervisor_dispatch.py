"""The supervisor's loop dispatches each live phase to one handler of a table (a phase added without one fails here,
where before `dict.get` let the loop idle in it); its start is a named transition; the signal record is written by
its handlers and its own methods alone (before, daemon/slurm/job.py counted a stop itself)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from minilmd.daemon.base.states import (
    FINAL_PHASES,
    INITIAL_PHASES,
    LAUNCH_PHASES,
    IllegalTransition,
    Phase,
    check_start,
)
from minilmd.daemon.host.signals import Signals
from minilmd.daemon.slurm import job as slurmjob
from minilmd.daemon.supervisor import HANDLERS

DAEMON = Path(__file__).resolve().parent.parent / "daemon"
SIGNAL_FIELDS = {"stop", "asked", "stop_by", "hup", "usr1"}


def test_every_live_phase_has_a_handler_and_no_final_one_has():
    assert set(HANDLERS) == set(Phase) - FINAL_PHASES - LAUNCH_PHASES  # the launch's own: before the loop runs


def test_the_start_goes_into_an_initial_phase_only():
    assert {check_start(p) for p in INITIAL_PHASES} == set(INITIAL_PHASES)
    for other in set(Phase) - INITIAL_PHASES:
        with pytest.raises(IllegalTransition):
            check_start(other)


def signal_field_writes(source: str) -> list[int]:
    """Lines that assign a signal record's field (`signals.stop = ...`, `self.signals.usr1 = ...`, `+=`)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in SIGNAL_FIELDS and \
                    ast.unparse(target.value).split(".")[-1] == "signals":
                lines.append(node.lineno)
    return lines


def test_only_the_signal_record_writes_its_fields():
    assert signal_field_writes("signals.stop = max(signals.stop, 1)\nself.signals.hup = False\nx.stop = 1\n") == [1, 2]
    writers = {str(p.relative_to(DAEMON)): lines for p in DAEMON.rglob("*.py")
               if p != DAEMON / "host" / "signals.py" and (lines := signal_field_writes(p.read_text()))}
    assert writers == {}


class Preemptible:
    preempted_by = ""  # on_signal looks at the job's end only after a preemption

    def preempt(self, how: str) -> bool:
        return True


def test_slurms_warning_asks_the_stop_as_a_first_signal():
    said: list[str] = []
    signals = Signals(usr1=True)
    slurmjob.on_signal(Preemptible(), signals, lambda kind, message: said.append(kind))
    assert (signals.stop, signals.usr1, said) == (1, False, ["slurm"])
    signals = Signals(stop=2, usr1=True)  # a SIGTERM came already, twice: the warning adds no stop
    slurmjob.on_signal(Preemptible(), signals, lambda kind, message: None)
    assert signals.stop == 2


def self_writes_outside(source: str, allowed: set[str]) -> list[str]:
    """`self.NAME = ...` (or +=, or annotated) in a method other than `allowed`'s: "method.NAME" each."""
    found = []
    for cls in (n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)):
        for method in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name not in allowed):
            for node in ast.walk(method):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
                found += [f"{method.name}.{t.attr}" for t in targets
                          if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"]
    return found


def test_the_loops_state_is_written_into_its_record_only():
    """What the loop and its ending set as they go (the exit status, how the run ended, the scratch kept) lives in
    one SupervisorState (daemon/loopstate.py): a method that sets an attribute of the supervisor's own instead writes
    where nothing reads (a merge left `self.ended = ...` in the ending: a run that ended unsynced said finished). The
    parts are made by __init__, run and _prepare_files only."""
    assert self_writes_outside("class A:\n    def f(self):\n        self.ended = 1\n        self.loop.ended = 2\n",
                               {"__init__"}) == ["f.ended"]
    for module in ("supervisor.py", "attempt.py", "ending.py"):
        assert self_writes_outside((DAEMON / module).read_text(), {"__init__", "run", "_prepare_files"}) == [], module
