"""Every signal minilmd sends goes through minilmd/procs.py, the one module that proves a process is the run's.

The test lists every call in the project's source that can send a signal (os.kill, os.killpg,
signal.pidfd_send_signal, pthread_kill, raise_signal, a Popen's send_signal, terminate or kill, and the same names
imported bare, under an alias, through a star import or from the C modules posix and _signal, fetched by a string
(getattr, __dict__), a raw ctypes syscall; and each command that signals (kill, pkill, scancel, tmux kill-session:
by basename, in an argv, a shell string or f-string, given to subprocess, os.system, os.exec*/spawn*, asyncio))
in the code and the scripts (source_tree.audited_files) and fails on one outside procs.py, but for the calls of
the trainer-child wrapper below, which itself goes through procs.py, held to their exact counts. A new way to
signal a process is added to procs.py, with its proof, or this test says where it is. At run time conftest.py's
autouse fixture (signal_backstop.py) fails a test in which the code sent os.kill, os.killpg or pidfd_send_signal
from anywhere but procs.py, however it was spelled, a name bound at the module's import (`from os import kill`) too.
A process killed past a timeout is one too: subprocess's run/call/check_output given `timeout=` kill the command
alone, so every such call outside procs.py is listed (KILLS_ON_TIMEOUT) but the reviewed ones; procs.run_bounded
kills the command's whole group.
"""
from __future__ import annotations

import ast
import itertools
import os
import threading
from collections import Counter
from pathlib import Path

import audit_calls
import signal_backstop
import source_tree
from minilmd import procs

REPO = source_tree.REPO

THE_MODULE = "minilmd/procs.py"
SENDS = {"kill", "killpg", "pidfd_send_signal", "send_signal", "terminate", "pthread_kill", "raise_signal"}
SIGNAL_MODULES = {"os", "signal"}
WRAPPER_CALLS = Counter({
    ("daemon/child/process.py", "self.kill"): 1,  # Child.kill_group -> Child.kill: procs.signal_child_group, Launch
    ("daemon/ending.py", "child.kill"): 2,  # the save grace spent, a stop's or a lost lease's; a Slurm job's deadline
    ("daemon/child/trainerwatch.py", "child.kill"): 2,  # a hang; the second stop signal (kill_on_second_stop)
})
"""Calls of daemon/child/process.py's Child.kill, which signals through procs.py only, each with how many: one more
(a new caller to review) or one fewer (a stale entry) fails."""


def python_files() -> list[Path]:
    return list(source_tree.audited_files())


def signalling_calls(path: Path, rel: str) -> list[tuple[str, int, str]]:
    """(file, line, call) of each use in `path` of something that can send a signal, called or not (`send =
    os.kill`, `partial(os.kill, ...)` send later): any method or module function of a sending name (os.kill, an
    aliased module's, a Popen's), a sending function of os or signal under any name (an alias, a star import, the
    C modules posix and _signal behind them), one fetched by a string (`getattr(os, "kill")`, `getattr(os, name)`,
    `os.__dict__["kill"]`), and a raw system call (ctypes' `libc.syscall(62, pid, sig)` is kill(2))."""
    module = source_tree.tree(path)
    names = audit_calls.qualified_names(module)
    calls = []
    for node in audit_calls.nodes(module):
        if isinstance(node, ast.Attribute) and node.attr in SENDS | {"syscall"}:
            calls.append((rel, node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names:
            of, _, function = names[node.id].rpartition(".")
            if of in SIGNAL_MODULES and function in SENDS:
                calls.append((rel, node.lineno, ast.unparse(node)))
    for line, of, name in audit_calls.dynamic_lookups(module, SIGNAL_MODULES, names):
        if name is None or name in SENDS:
            calls.append((rel, line, f"{of}.{name or '<a name not spelled out>'}"))
    return sorted(calls, key=lambda c: c[1])


def outside_the_module(files: list[Path], wrappers: Counter = WRAPPER_CALLS) -> list[str]:
    """Each signalling call outside procs.py that is not a reviewed wrapper call, and each wrapper entry whose count
    differs from the calls found (a stale or a new one)."""
    found, seen = [], Counter()
    for path in files:
        rel = source_tree.relative(path)
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
                 "kill-pane", "py-spy", "gdb", "strace", "ltrace", "gcore", "ptrace"}
"""Programs (and tmux's, systemctl's subcommands) that signal processes: Slurm's scancel, the shell's kill, tmux
kill-session (every process in the session), `systemctl kill`; and the tracers, whose ptrace stops a process and
reads its memory (py-spy dump, gdb, strace, ltrace, gcore): as a signal, only to a process proven the run's."""

PID_OPTIONS = ("--pid", "-p")
"""The option by which a tool is told which process to act on (py-spy, gdb, strace, ltrace, pidstat, perf, lsof):
given a value not written in the code (a variable, an f-string), a process chosen at run time, which procs.py is
to prove the run's first, whatever the program (a name the audit cannot read: `shutil.which("py-spy")`)."""


def _pid_given_at_run_time(elts: list[ast.expr]) -> bool:
    """An argv with `--pid X`, `-p X` or `--pid=X` where X is not a literal."""
    for i, e in enumerate(elts):
        if isinstance(e, ast.Constant) and e.value in PID_OPTIONS and i + 1 < len(elts) \
                and not isinstance(elts[i + 1], ast.Constant):
            return True
        if isinstance(e, ast.JoinedStr) and e.values and isinstance(e.values[0], ast.Constant) \
                and str(e.values[0].value).startswith(tuple(f"{o}=" for o in PID_OPTIONS)):
            return True
    return False


def _pid_in_a_shell_string(node: ast.expr) -> bool:
    """A shell f-string with `--pid {x}`, `-p {x}` or `--pid={x}`."""
    if not isinstance(node, ast.JoinedStr):
        return False
    for before, after in itertools.pairwise(node.values):
        if isinstance(before, ast.Constant) and isinstance(after, ast.FormattedValue) \
                and str(before.value).rstrip(" =").split(" ")[-1] in PID_OPTIONS:
            return True
    return False


def kill_commands(path: Path) -> list[int]:
    """Lines of `path` where a command that signals (or traces) processes is built in code, not in prose: one of
    KILL_COMMANDS (by its basename: /bin/kill is kill) as an element of a list or a tuple (an argv: `["scancel",
    ...]`, `["tmux", "kill-session", ...]`), any word of a command given to a call that starts a process (a shell
    string, an f-string, an argv, a name assigned the program: audit_calls.spawned_commands), or an argv or shell
    f-string that names its process by a pid given at run time (PID_OPTIONS), whatever the program."""
    module = source_tree.tree(path)
    names = audit_calls.qualified_names(module)
    lines = {e.lineno for node in audit_calls.nodes(module) if isinstance(node, (ast.List, ast.Tuple))
             for e in node.elts
             if isinstance(e, ast.Constant) and isinstance(e.value, str)
             and e.value.rsplit("/", 1)[-1] in KILL_COMMANDS}
    lines |= {line for line, words in audit_calls.spawned_commands(module) if KILL_COMMANDS & set(words)}
    lines |= {node.lineno for node in audit_calls.nodes(module)
              if isinstance(node, (ast.List, ast.Tuple)) and _pid_given_at_run_time(node.elts)}
    lines |= {node.lineno for node in audit_calls.nodes(module) if isinstance(node, ast.Call)
              and audit_calls.spawner(node, names) and any(_pid_in_a_shell_string(a) for a in node.args)}
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


TRACERS = '''\
import os, shutil, subprocess

def f(pid, exe):
    py_spy = shutil.which("py-spy")
    subprocess.run([py_spy, "dump", "--pid", str(pid)])
    subprocess.run(["strace", "-f", "-p", "1"])
    argv = [exe, f"--pid={pid}"]
    os.system(f"gdb -batch -p {pid}")
    subprocess.run(["mkdir", "-p", "/tmp/x"])
    subprocess.run(["ls", "-p", str(exe)])
'''


def test_a_tracer_or_a_pid_given_at_run_time_is_seen_outside_procs(tmp_path):
    """A tracer (ptrace stops the process) is run from procs.py only, like a signal: by name (strace, gdb), and, for
    a program the audit cannot name (`shutil.which("py-spy")` in a variable), by the pid it is given at run time;
    a literal after -p (mkdir -p /tmp/x) is not a process chosen at run time."""
    bad = tmp_path / "bad.py"
    bad.write_text(TRACERS, encoding="utf-8")
    assert kill_commands(bad) == [5, 6, 7, 8, 10]


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
                     "os.kill"]  # the last: getattr(os, 'kill')
    assert len(signalling_calls(REPO / THE_MODULE, THE_MODULE)) >= 3  # procs.py itself sends: the scan sees it


def test_a_wrapper_entry_whose_call_is_gone_or_doubled_fails(tmp_path):
    """WRAPPER_CALLS is held to exact counts: a reviewed wrapper call that is gone, or one more of it, is listed."""
    one = tmp_path / "one.py"
    one.write_text("def f(child):\n    child.kill()\n    child.kill()\n", encoding="utf-8")
    wrappers = Counter({("one.py", "child.kill"): 1, ("gone.py", "self.kill"): 1})
    assert outside_the_module([one], wrappers) == ["gone.py: self.kill(...) x0, listed in WRAPPER_CALLS x1",
                                                   "one.py: child.kill(...) x2, listed in WRAPPER_CALLS x1"]
    assert outside_the_module([one], Counter({("one.py", "child.kill"): 2})) == []


ESCAPES = '''\
import asyncio, ctypes, os, subprocess
from os import *
from posix import kill as pk
from _signal import pthread_kill as ptk

def f(pid, sig, lib, name):
    kill(pid, 9)
    pk(pid, 9)
    ptk(1, 9)
    getattr(os, "ki" + "ll")(pid, 9)
    os.__dict__["kill"](pid, 9)
    ctypes.CDLL(None).syscall(62, pid, 9)
    os.system(f"kill -9 {pid}")
    subprocess.run(["/bin/kill", "-9", str(pid)])
    subprocess.run(f"scancel {name}", shell=True)
    asyncio.create_subprocess_exec("kill", "-9", str(pid))
    os.spawnlp(os.P_WAIT, "kill", "kill", "-9", str(pid))
    cmd = "pkill"; subprocess.run([cmd, "-f", "x"])
    subprocess.run(["env", "pkill", "-f", "x"])
    os.system("true; kill 1")
'''


def test_every_other_spelling_of_a_signal_is_seen(tmp_path):
    """A sending function reached through a star import, the C modules behind os and signal, a name built at run
    time, the module's __dict__ or a raw system call; a kill command by its full path, in an f-string, given to
    asyncio, os.spawn* or a name, or after another command: each is listed."""
    bad = tmp_path / "bad.py"
    bad.write_text(ESCAPES, encoding="utf-8")
    assert [(line, call) for _, line, call in signalling_calls(bad, "daemon/bad.py")] == [
        (7, "kill"), (8, "pk"), (9, "ptk"), (10, "os.<a name not spelled out>"), (11, "os.kill"),
        (12, "ctypes.CDLL(None).syscall")]
    assert kill_commands(bad) == [13, 14, 15, 16, 17, 18, 19, 20]


def test_the_backstop_sees_a_signal_the_code_sends_outside_procs(signals_sent_through_procs):
    """conftest's autouse fixture: a function of the code outside procs.py that sends signal 0 (harmless) to this
    process or thread, by os.kill however reached or by pthread_kill, is noted with its file and line; the same from
    procs.py or a test is not."""
    planted: dict = {}
    exec(compile("import os, signal, threading\ndef send(pid):\n    getattr(os, 'ki' + 'll')(pid, 0)\n"
                 "def to_thread():\n    signal.pthread_kill(threading.get_ident(), 0)\n",
                 str(REPO / "daemon" / "planted.py"), "exec"), planted)
    planted["send"](os.getpid())
    planted["to_thread"]()
    procs.signal_self(0)
    os.kill(os.getpid(), 0)  # a test may
    found, signals_sent_through_procs[:] = list(signals_sent_through_procs), []
    assert found == [f"daemon/planted.py:3: os.kill({os.getpid()}, 0)",
                     f"daemon/planted.py:5: signal.pthread_kill({threading.get_ident()}, 0)"]


BOUND_AT_IMPORT: dict = {}
exec(compile("from os import kill, killpg\nfrom signal import pthread_kill\nfrom posix import kill as posix_kill\n"
             "def send(pid, group, thread):\n    kill(pid, 0)\n    killpg(group, 0)\n    pthread_kill(thread, 0)\n"
             "    posix_kill(pid, 0)\n", str(REPO / "daemon" / "bound_early.py"), "exec"), BOUND_AT_IMPORT)
"""A module of the code that bound the sending functions by name at its import, which happens here at collection,
before any test's fixture runs."""


def test_the_backstop_sees_a_sender_bound_by_name_at_import(signals_sent_through_procs):
    """`from os import kill` (killpg, signal's pthread_kill, posix's kill) run at a module's import, before a test
    starts, binds the watching function: the backstop replaces them for the whole test process, before the code is
    imported. Replaced at each test's start, it left such a name the original and saw none of these calls."""
    BOUND_AT_IMPORT["send"](os.getpid(), os.getpgid(0), threading.get_ident())
    found, signals_sent_through_procs[:] = list(signals_sent_through_procs), []
    assert found == [f"daemon/bound_early.py:5: os.kill({os.getpid()}, 0)",
                     f"daemon/bound_early.py:6: os.killpg({os.getpgid(0)}, 0)",
                     f"daemon/bound_early.py:7: signal.pthread_kill({threading.get_ident()}, 0)",
                     f"daemon/bound_early.py:8: posix.kill({os.getpid()}, 0)"]


def test_the_backstop_refuses_to_start_after_the_code_is_imported():
    """Imported after a module of the product, the backstop would watch with that module's names unwatched: it names
    the modules (and refuses, at conftest's import); a test's own helpers and the standard library do not count."""
    assert signal_backstop.imported_too_early({
        "minilmd.daemon.planted": type("M", (), {"__file__": str(REPO / "daemon" / "planted.py")}),
        "supervisor_helpers": type("M", (), {"__file__": str(REPO / "tests" / "supervisor_helpers.py")}),
        "os": os, "builtins": type("M", (), {})}) == ["minilmd.daemon.planted"]


KILLS_ON_TIMEOUT = {"run", "call", "check_call", "check_output"}
"""The calls that start a process and, past a `timeout=`, kill it: subprocess's (and a wrapper of them, such as
pychild.run, by the same name). They kill the command alone (Popen.kill), not what it started, and outside
procs.py: a command bounded in time runs through procs.run_bounded, which kills its whole group."""
TIMEOUTS_REVIEWED = Counter({
    # pychild.run, the one way to start a Python child (which run_bounded is not), bounding a `minilmd` command:
    ("scripts/dpo_steps_sidebyside.py", "pychild.run"): 1,  # a comparison run by hand; the bound raises, it ends
    ("scripts/gpu_check_part.py", "pychild.run"): 1,  # a device check's part: what is left of a supervisor's trainer
    # past the bound is killed by kill_leftovers (through procs), proven the run's
})


def killing_timeouts(path: Path) -> list[tuple[int, str]]:
    """(line, call) of each call named as one of KILLS_ON_TIMEOUT (a module's function or a method: subprocess.run,
    sp.run, pychild.run) given a `timeout=`."""
    return [(node.lineno, ast.unparse(node.func)) for node in audit_calls.nodes(source_tree.tree(path))
            if isinstance(node, ast.Call) and any(k.arg == "timeout" for k in node.keywords)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None))
            in KILLS_ON_TIMEOUT]


def timeouts_outside_procs(files: list[Path], reviewed: Counter = TIMEOUTS_REVIEWED) -> list[str]:
    """Each such call outside procs.py not reviewed, and each review whose count differs from the calls found."""
    found, seen = [], Counter()
    for path in files:
        rel = source_tree.relative(path)
        for line, call in killing_timeouts(path) if rel != THE_MODULE else []:
            if (rel, call) in reviewed:
                seen[(rel, call)] += 1
            else:
                found.append(f"{rel}:{line}: {call}(..., timeout=...)")
    return found + [f"{rel}: {call}(..., timeout=...) x{seen[(rel, call)]}, reviewed x{n}"
                    for (rel, call), n in sorted(reviewed.items()) if seen[(rel, call)] != n]


def test_a_command_bounded_in_time_is_killed_with_its_group_through_procs(tmp_path):
    """subprocess.run(..., timeout=) kills only the command past its bound (house8 item 7: py-spy, dmesg, scontrol):
    every such call runs through procs.run_bounded, but the reviewed ones; the audit sees each spelling."""
    problems = timeouts_outside_procs(python_files())
    assert not problems, ("a command bounded by subprocess's timeout= (it kills the command alone, not what it "
                          "started): use procs.run_bounded, or review it here:\n" + "\n".join(problems))
    bad = tmp_path / "bad.py"
    bad.write_text("import subprocess as sp\nfrom subprocess import check_output\nfrom minilmd import pychild\n"
                   "def f(argv, proc):\n    sp.run(argv, timeout=5)\n    check_output(argv, timeout=1)\n"
                   "    pychild.run(argv, timeout=9)\n    proc.communicate(timeout=3)\n    sp.run(argv)\n",
                   encoding="utf-8")
    assert timeouts_outside_procs([bad], Counter({("bad.py", "pychild.run"): 1, ("gone.py", "x.run"): 1})) == [
        "bad.py:5: sp.run(..., timeout=...)", "bad.py:6: check_output(..., timeout=...)",
        "gone.py: x.run(..., timeout=...) x0, reviewed x1"]
