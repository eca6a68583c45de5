"""Every signal minilmd sends goes through minilmd/procs.py, the one module that proves a process is the run's.

The test lists every call in the project's source that can send a signal (os.kill, os.killpg,
signal.pidfd_send_signal, a Popen's send_signal, terminate or kill, and the same names imported bare) and fails on
one outside procs.py, but for the calls of the trainer-child wrapper below, which itself goes through procs.py. A new
way to signal a process is added to procs.py, with its proof, or this test says where it is.
"""
from __future__ import annotations

import ast
from pathlib import Path

from import_helpers import REPO

SOURCE = ("minilmd", "daemon", "trainer", "scripts", "deploy")
THE_MODULE = "minilmd/procs.py"
SENDS = {"kill", "killpg", "pidfd_send_signal", "send_signal", "terminate"}
WRAPPER_CALLS = {
    ("daemon/child/process.py", "self.kill"),  # Child.kill_group -> Child.kill: procs.signal_child_group, Launch
    ("daemon/supervisor.py", "self.child.kill"),
    ("daemon/ending.py", "child.kill"),
    ("daemon/child/trainerwatch.py", "child.kill"),
}
"""Calls of daemon/child/process.py's Child.kill, which signals through procs.py only."""


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


def signalling_calls(path: Path, rel: str) -> list[tuple[str, int, str]]:
    """(file, line, call) of each call in `path` that can send a signal."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in SENDS:
            calls.append((rel, node.lineno, ast.unparse(func)))
    return calls


def outside_the_module(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        if rel == THE_MODULE:
            continue
        found += [f"{rel}:{line}: {call}(...)" for rel, line, call in signalling_calls(path, rel)
                  if (rel, call) not in WRAPPER_CALLS]
    return found


def test_every_signal_is_sent_through_procs():
    files = python_files()
    assert any(p.name == "gpu-check" for p in files)  # the scripts without a suffix are read too
    problems = outside_the_module(files)
    assert not problems, ("a signal sent outside minilmd/procs.py (the one place that proves a process is the "
                          "run's):\n" + "\n".join(problems))


def test_the_listing_sees_each_way_to_send(tmp_path):
    """It can fail: each way to send a signal, in a module outside procs.py, is listed."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os, signal\nfrom os import kill\n\ndef f(p, proc, fd):\n    os.kill(p, 9)\n"
                   "    os.killpg(p, 9)\n    signal.pidfd_send_signal(fd, 15)\n    proc.send_signal(15)\n"
                   "    proc.terminate()\n    proc.kill()\n    kill(p, 9)\n", encoding="utf-8")
    calls = [call for _, _, call in signalling_calls(bad, "daemon/bad.py")]
    assert calls == ["os.kill", "os.killpg", "signal.pidfd_send_signal", "proc.send_signal", "proc.terminate",
                     "proc.kill", "kill"]
    assert len(signalling_calls(REPO / THE_MODULE, THE_MODULE)) >= 3  # procs.py itself sends: the scan sees it
