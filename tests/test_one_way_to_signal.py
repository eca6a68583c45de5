"""Every signal minilmd sends goes through minilmd/procs.py, the one module that proves a process is the run's.

The test lists every call in the project's source that can send a signal (os.kill, os.killpg,
signal.pidfd_send_signal, pthread_kill, raise_signal, a Popen's send_signal, terminate or kill, and the same names
imported bare or under an alias, and Slurm's scancel) and fails on one outside procs.py, but for the calls of
the trainer-child wrapper below, which itself goes through procs.py, held to their exact counts. A new way to
signal a process is added to procs.py, with its proof, or this test says where it is.
"""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import source_tree
from import_helpers import REPO

SOURCE = ("minilmd", "daemon", "trainer", "scripts", "deploy")
THE_MODULE = "minilmd/procs.py"
SENDS = {"kill", "killpg", "pidfd_send_signal", "send_signal", "terminate", "pthread_kill", "raise_signal"}
SIGNAL_MODULES = ("os", "signal")
WRAPPER_CALLS = Counter({
    ("daemon/child/process.py", "self.kill"): 1,  # Child.kill_group -> Child.kill: procs.signal_child_group, Launch
    ("daemon/supervisor.py", "self.child.kill"): 1,
    ("daemon/ending.py", "child.kill"): 1,
    ("daemon/child/trainerwatch.py", "child.kill"): 1,
})
"""Calls of daemon/child/process.py's Child.kill, which signals through procs.py only, each with how many: one more
(a new caller to review) or one fewer (a stale entry) fails."""


def python_files() -> list[Path]:
    found = []
    for folder in SOURCE:
        for path in sorted((REPO / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix == ".py" or (path.suffix == "" and path.read_bytes()[:64].startswith(b"#!/usr/bin/env "
                                                                                             b"python")):
                found.append(path)
    return found


def imported_senders(module: ast.Module) -> set[str]:
    """The local names of os's and signal's sending functions imported by name, aliases included
    (`from os import kill as k` gives k)."""
    return {alias.asname or alias.name for node in ast.walk(module)
            if isinstance(node, ast.ImportFrom) and node.module in SIGNAL_MODULES and not node.level
            for alias in node.names if alias.name in SENDS}


def signalling_calls(path: Path, rel: str) -> list[tuple[str, int, str]]:
    """(file, line, call) of each call in `path` that can send a signal: any method or module function of a
    sending name (os.kill, an aliased module's, a Popen's), and a sending function imported under any name."""
    module = source_tree.tree(path)
    bare = imported_senders(module)
    calls = []
    for node in ast.walk(module):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr in SENDS) or (isinstance(func, ast.Name) and func.id in bare):
            calls.append((rel, node.lineno, ast.unparse(func)))
    return sorted(calls, key=lambda c: c[1])


def outside_the_module(files: list[Path], wrappers: Counter = WRAPPER_CALLS) -> list[str]:
    """Each signalling call outside procs.py that is not a reviewed wrapper call, and each wrapper entry whose count
    differs from the calls found (a stale or a new one)."""
    found, seen = [], Counter()
    for path in files:
        rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
        if rel == THE_MODULE:
            continue
        for _, line, call in signalling_calls(path, rel):
            if (rel, call) in wrappers:
                seen[(rel, call)] += 1
            else:
                found.append(f"{rel}:{line}: {call}(...)")
    found += [f"{rel}: {call}(...) x{seen[(rel, call)]}, listed in WRAPPER_CALLS x{n}"
              for (rel, call), n in sorted(wrappers.items()) if seen[(rel, call)] != n]
    return found


def test_every_signal_is_sent_through_procs():
    files = python_files()
    assert any(p.name == "gpu-check" for p in files)  # the scripts without a suffix are read too
    problems = outside_the_module(files)
    assert not problems, ("a signal sent outside minilmd/procs.py (the one place that proves a process is the "
                          "run's), or a WRAPPER_CALLS entry to update:\n" + "\n".join(problems))


def scancel_commands(path: Path) -> list[int]:
    """Lines of `path` where a "scancel" string is in code (a command list, a constant), not a docstring: Slurm's
    way to signal a job's tasks."""
    module = source_tree.tree(path)
    docstrings = {id(node.value) for node in ast.walk(module) if isinstance(node, ast.Expr)}
    return sorted(node.lineno for node in ast.walk(module) if isinstance(node, ast.Constant)
                  and node.value == "scancel" and id(node) not in docstrings)


def test_slurm_jobs_are_signalled_through_procs_only(tmp_path):
    """scancel signals every task of a job's steps: it is sent from procs.py, which proves the job is this one."""
    found = [f"{path.relative_to(REPO).as_posix()}:{line}" for path in python_files()
             if path.relative_to(REPO).as_posix() != THE_MODULE for line in scancel_commands(path)]
    assert not found, "scancel outside minilmd/procs.py:\n" + "\n".join(found)
    assert scancel_commands(REPO / THE_MODULE)  # the scan sees the one place
    bad = tmp_path / "bad.py"
    bad.write_text('"""scancel in a docstring is prose."""\nCMD = ["scancel", "--signal=TERM", "1"]\n',
                   encoding="utf-8")
    assert scancel_commands(bad) == [2]


def test_the_listing_sees_each_way_to_send(tmp_path):
    """It can fail: each way to send a signal, in a module outside procs.py, is listed, under any name."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os, signal\nimport os as o\nfrom os import kill\nfrom os import killpg as kp\n"
                   "from signal import pthread_kill as pk\n\ndef f(p, proc, fd):\n    os.kill(p, 9)\n"
                   "    os.killpg(p, 9)\n    signal.pidfd_send_signal(fd, 15)\n    proc.send_signal(15)\n"
                   "    proc.terminate()\n    proc.kill()\n    kill(p, 9)\n    o.kill(p, 9)\n    kp(p, 9)\n"
                   "    pk(1, 9)\n    signal.raise_signal(9)\n    len(p)\n", encoding="utf-8")
    calls = [call for _, _, call in signalling_calls(bad, "daemon/bad.py")]
    assert calls == ["os.kill", "os.killpg", "signal.pidfd_send_signal", "proc.send_signal", "proc.terminate",
                     "proc.kill", "kill", "o.kill", "kp", "pk", "signal.raise_signal"]
    assert len(signalling_calls(REPO / THE_MODULE, THE_MODULE)) >= 3  # procs.py itself sends: the scan sees it


def test_a_wrapper_entry_whose_call_is_gone_or_doubled_fails(tmp_path):
    """WRAPPER_CALLS is held to exact counts: a reviewed wrapper call that is gone, or one more of it, is listed."""
    one = tmp_path / "one.py"
    one.write_text("def f(child):\n    child.kill()\n    child.kill()\n", encoding="utf-8")
    wrappers = Counter({("one.py", "child.kill"): 1, ("gone.py", "self.kill"): 1})
    assert outside_the_module([one], wrappers) == ["gone.py: self.kill(...) x0, listed in WRAPPER_CALLS x1",
                                                   "one.py: child.kill(...) x2, listed in WRAPPER_CALLS x1"]
    assert outside_the_module([one], Counter({("one.py", "child.kill"): 2})) == []
