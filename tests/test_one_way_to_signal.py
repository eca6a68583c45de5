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
    ("daemon/supervisor.py", "child.kill"): 1,  # the second stop signal: child := self.loop.child
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
    """(file, line, call) of each use in `path` of something that can send a signal, called or not (`send =
    os.kill`, `partial(os.kill, ...)` send later): any method or module function of a sending name (os.kill, an
    aliased module's, a Popen's), a sending function imported under any name, and `getattr(_, "kill")`."""
    module = source_tree.tree(path)
    bare = imported_senders(module)
    calls = []
    for node in ast.walk(module):
        if (isinstance(node, ast.Attribute) and node.attr in SENDS) or (
                isinstance(node, ast.Name) and node.id in bare and isinstance(node.ctx, ast.Load)):
            calls.append((rel, node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in SENDS):
            calls.append((rel, node.lineno, ast.unparse(node)))
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


KILL_COMMANDS = {"scancel", "kill", "pkill", "killall", "skill", "kill-session", "kill-server", "kill-window",
                 "kill-pane"}
"""Programs (and tmux's, systemctl's subcommands) that signal processes: Slurm's scancel, the shell's kill, tmux
kill-session (every process in the session), `systemctl kill`."""
SHELL_RUNNERS = {"system", "popen", "run", "Popen", "call", "check_call", "check_output", "getoutput",
                 "getstatusoutput"}


def kill_commands(path: Path) -> list[int]:
    """Lines of `path` where a command that signals processes is built in code, not in prose: one of
    KILL_COMMANDS as an element of a list or a tuple (an argv: `["scancel", ...]`, `["tmux", "kill-session", ...]`),
    or first in a string given to a shell runner (`os.system("kill -9 ...")`)."""
    module = source_tree.tree(path)
    lines = []
    for node in ast.walk(module):
        if isinstance(node, (ast.List, ast.Tuple)):
            lines += [e.lineno for e in node.elts if isinstance(e, ast.Constant) and e.value in KILL_COMMANDS]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and isinstance(
                node.args[0].value, str) and node.args[0].value.split()[:1] and (
                (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None))
                in SHELL_RUNNERS) and node.args[0].value.split()[0] in KILL_COMMANDS:
            lines.append(node.lineno)
    return sorted(lines)


def test_commands_that_signal_are_run_from_procs_only(tmp_path):
    """scancel signals every task of a job's steps, `kill`/`pkill` any process by pid or name, tmux kill-session
    every process of a session: each is run from procs.py, which proves the job, process or session is the run's."""
    found = [f"{path.relative_to(REPO).as_posix()}:{line}" for path in python_files()
             if path.relative_to(REPO).as_posix() != THE_MODULE for line in kill_commands(path)]
    assert not found, "a command that signals processes outside minilmd/procs.py:\n" + "\n".join(found)
    assert kill_commands(REPO / THE_MODULE)  # the scan sees the one place
    bad = tmp_path / "bad.py"
    bad.write_text('"""scancel, kill and pkill in a docstring are prose."""\nimport os, subprocess\n'
                   'CMD = ["scancel", "--signal=TERM", "1"]\n'
                   'def f(events, pid):\n    events.emit("kill", "an event kind, not a command")\n'
                   '    subprocess.run(("pkill", "-f", "minilmd"))\n    os.system("kill -9 1")\n'
                   '    subprocess.run(["tmux", "kill-session", "-t", "x"])\n'
                   '    subprocess.run(["systemctl", "kill", "unit"])\n', encoding="utf-8")
    assert kill_commands(bad) == [3, 6, 7, 8, 9]


def test_the_listing_sees_each_way_to_send(tmp_path):
    """It can fail: each way to send a signal, in a module outside procs.py, is listed, under any name."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os, signal\nimport os as o\nfrom os import kill\nfrom os import killpg as kp\n"
                   "from signal import pthread_kill as pk\n\ndef f(p, proc, fd):\n    os.kill(p, 9)\n"
                   "    os.killpg(p, 9)\n    signal.pidfd_send_signal(fd, 15)\n    proc.send_signal(15)\n"
                   "    proc.terminate()\n    proc.kill()\n    kill(p, 9)\n    o.kill(p, 9)\n    kp(p, 9)\n"
                   "    pk(1, 9)\n    signal.raise_signal(9)\n    len(p)\n    send = os.kill\n"
                   "    later = functools.partial(os.killpg, p, 9)\n    getattr(os, 'kill')(p, 9)\n",
                   encoding="utf-8")
    calls = [call for _, _, call in signalling_calls(bad, "daemon/bad.py")]
    assert calls == ["os.kill", "os.killpg", "signal.pidfd_send_signal", "proc.send_signal", "proc.terminate",
                     "proc.kill", "kill", "o.kill", "kp", "pk", "signal.raise_signal", "os.kill", "os.killpg",
                     "getattr(os, 'kill')"]
    assert len(signalling_calls(REPO / THE_MODULE, THE_MODULE)) >= 3  # procs.py itself sends: the scan sees it


def test_a_wrapper_entry_whose_call_is_gone_or_doubled_fails(tmp_path):
    """WRAPPER_CALLS is held to exact counts: a reviewed wrapper call that is gone, or one more of it, is listed."""
    one = tmp_path / "one.py"
    one.write_text("def f(child):\n    child.kill()\n    child.kill()\n", encoding="utf-8")
    wrappers = Counter({("one.py", "child.kill"): 1, ("gone.py", "self.kill"): 1})
    assert outside_the_module([one], wrappers) == ["gone.py: self.kill(...) x0, listed in WRAPPER_CALLS x1",
                                                   "one.py: child.kill(...) x2, listed in WRAPPER_CALLS x1"]
    assert outside_the_module([one], Counter({("one.py", "child.kill"): 2})) == []
