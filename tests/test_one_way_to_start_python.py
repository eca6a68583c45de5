"""Every Python process minilmd starts is built by minilmd/pychild.py (`-P`, PYTHONSAFEPATH, the working directory
"/"), so that no directory another user can write comes first on its import path.

The test reads the code and the scripts (source_tree.audited_files) and lists each use of the running interpreter's
path (sys.executable, sys._base_executable, sys.orig_argv, /proc/self/exe, shutil.which("python3"), under any name),
each command that names a Python or torchrun by a string in code (an argv's element by its basename, any word of a
command given to subprocess, os.system, os.exec*/spawn* or asyncio, f-strings and names holding the program
included), and each pychild argv handed to such a call itself rather than to pychild.run/popen (which set its
environment and working directory with it), outside pychild.py, and fails on one that is not reviewed below, with
its reason. A new way to start Python goes through pychild.run / popen, or is added here with why it is safe.

multiprocessing starts Pythons too (spawn's and forkserver's `python -c`, in this process's working directory), out
of pychild's reach: each use of multiprocessing, torch.multiprocessing or concurrent.futures' ProcessPoolExecutor
(under any name, or a module imported by its name as a string) is listed the same way. The code has one: the corpus
tools' workers (minilmd/corpus/workers.py: spawn_context, WorkerPool), reviewed below; a pool or a Process of
another module goes through them.
"""
from __future__ import annotations

import ast
import os
import re
from collections import Counter
from pathlib import Path

import pytest

import audit_calls
import source_tree
from minilmd import pychild

THE_MODULE = "minilmd/pychild.py"
PYTHON = re.compile(r"(python|pypy)[0-9.]*|torchrun")
"""A program that is a Python (by its basename: /usr/bin/python3.12 too) or torchrun."""
INTERPRETER = {"executable", "_base_executable", "orig_argv"}
"""sys's names for this interpreter (sys.orig_argv[0] is it)."""
ARGV_BUILDERS = {"minilmd.pychild.python_argv", "minilmd.pychild.module_argv"}
PROCESS_POOLS = re.compile(r"(torch\.)?multiprocessing(\..+)?"
                           r"|concurrent\.futures\.(process(\..+)?|ProcessPoolExecutor)")
"""What starts Pythons of multiprocessing's (spawn, forkserver) by a dotted name, a module's or a function's."""
POOL_MODULES = re.compile(r"(torch\.)?multiprocessing(\..+)?|concurrent\.futures\.process")
"""The same modules named by a string (importlib.import_module, __import__)."""
REVIEWED = Counter({
    # exec of this same process (same pid) with the supervisor's identity in its environment: sys.orig_argv keeps
    # the flags it was started with, and the `minilmd` console script's sys.path[0] is the venv's bin/
    ("minilmd/procs.py", "sys.executable"): 2,
    ("minilmd/procs.py", "sys.orig_argv"): 1,
    # named in words, never run: which Python lacks the tensorboard package (`run --check`'s problem)
    ("minilmd/probes.py", "sys.executable"): 1,
    **{(script, "sys.executable"): n for script, n in {
        # The reference MiniMind's training scripts (train_pretrain.py, train_full_sft.py, train_dpo.py), which
        # import their own modules (model/, dataset/) from their directory: run there, as their README says, in a
        # copy the device check made of them under its --work directory. What they import is that copy's.
        "scripts/gpu_check_sidebyside.py": 1, "scripts/gpu_check_sft.py": 1, "scripts/gpu_check_dpo.py": 1,
        "scripts/dpo_steps_sidebyside.py": 1,  # its --python (default this interpreter) for the reference's side
        # gpu-check running one of its own parts (`gpu-check --part NAME`: sys.path[0] is the checkout's scripts/,
        # the script's own directory, whose modules it imports).
        "scripts/gpu-check": 1}.items()},
    # The corpus tools' worker processes, started by multiprocessing's spawn (`python -c`, in the working directory
    # of the command): the one context of the code (spawn_context; tokenizer train's process is one of it) and the
    # one pool (WorkerPool). They run in `minilmd`'s own process, or in a child minilmd started, whose environment
    # holds PYTHONSAFEPATH=1 (pychild.guard_descendants in the console script's main, child_env for every child):
    # the spawned interpreter and multiprocessing's resource tracker prepend no directory to their path
    # (tests/test_safe_path.py::test_prepare_workers_spawned_from_a_planted_directory_run_none_of_her_code).
    ("minilmd/corpus/workers.py", "multiprocessing.get_context"): 1,
    ("minilmd/corpus/workers.py", "concurrent.futures.ProcessPoolExecutor"): 1,
})


def _is_python(word: str) -> bool:
    return PYTHON.fullmatch(word.rsplit("/", 1)[-1]) is not None


def _pychild_argvs(module: ast.Module, names: dict[str, str]) -> tuple[set[int], set[str]]:
    """The calls that build a pychild argv (by id) and the local names assigned one (`cmd = module_argv(...)`)."""
    calls = {id(n) for n in audit_calls.nodes(module)
             if isinstance(n, ast.Call) and audit_calls.dotted(n.func, names) in ARGV_BUILDERS}
    held = {t.id for n in audit_calls.nodes(module) if isinstance(n, ast.Assign)
            and any(id(c) in calls for c in ast.walk(n.value)) for t in n.targets if isinstance(t, ast.Name)}
    return calls, held


def process_pools(module: ast.Module, names: dict[str, str]) -> list[tuple[int, str]]:
    """(line, dotted name) of each use of multiprocessing, torch.multiprocessing or ProcessPoolExecutor (PROCESS_POOLS)
    under any name (`import multiprocessing as mp`, `from multiprocessing import get_context`, a star import, `from
    concurrent import futures`), called or not (a base class, `ctx = mp.get_context`): the whole dotted name once,
    not each part of it; and each string naming one of those modules (`importlib.import_module("multiprocessing")`)."""
    used = {n: name for n in audit_calls.nodes(module) if isinstance(n, (ast.Name, ast.Attribute))
            and not (isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load))
            and (name := audit_calls.dotted(n, names)) and PROCESS_POOLS.fullmatch(name)}
    parts = {id(n.value) for n in used if isinstance(n, ast.Attribute)}
    found = [(n.lineno, name) for n, name in used.items() if id(n) not in parts]
    found += [(n.lineno, repr(n.value)) for n in audit_calls.nodes(module) if isinstance(n, ast.Constant)
              and isinstance(n.value, str) and POOL_MODULES.fullmatch(n.value)]
    return found


def interpreter_uses(path: Path, rel: str) -> list[tuple[str, int, str]]:
    """(file, line, what) of each use of the interpreter's path (sys.executable, sys._base_executable,
    sys.orig_argv, /proc/self/exe, shutil.which("python3"), under any name), of each Python named by a string as a
    command (an argv's element, a word of a command given to subprocess, os.system, os.exec*/spawn*, asyncio,
    f-strings and names assigned the program included: audit_calls.spawned_commands), of a pychild argv
    handed to such a call directly, not to pychild.run/popen (its environment and working directory unset), and of
    multiprocessing or a process pool (process_pools)."""
    module = source_tree.tree(path)
    names, constants = audit_calls.qualified_names(module), audit_calls.string_constants(module)
    argv_calls, argv_names = _pychild_argvs(module, names)
    found = []
    for node in audit_calls.nodes(module):
        name = audit_calls.dotted(node, names) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if name and name.startswith("sys.") and name[4:] in INTERPRETER and (
                not isinstance(node, ast.Name) or isinstance(node.ctx, ast.Load)):
            found.append((rel, node.lineno, name))
        elif isinstance(node, ast.Constant) and node.value == "/proc/self/exe":
            found.append((rel, node.lineno, "/proc/self/exe"))
        elif isinstance(node, (ast.List, ast.Tuple)):
            found += [(rel, e.lineno, word) for e in node.elts if isinstance(e, (ast.Constant, ast.Name))
                      for word in audit_calls.command_words(e, constants)[:1] if _is_python(word)]
        elif isinstance(node, ast.Call):
            if audit_calls.dotted(node.func, names) == "shutil.which" and node.args and \
                    isinstance(node.args[0], ast.Constant) and _is_python(str(node.args[0].value)):
                found.append((rel, node.lineno, f"shutil.which({node.args[0].value!r})"))
            if audit_calls.spawner(node, names) is None:
                continue
            if not (node.args and isinstance(node.args[0], (ast.List, ast.Tuple))):  # a list's: seen as a list
                words = audit_calls.command_of(node, names, constants)
                found += [(rel, node.lineno, w) for w in dict.fromkeys(words) if _is_python(w)]
            if any(id(n) in argv_calls or (isinstance(n, ast.Name) and n.id in argv_names)
                   for arg in node.args[:1] for n in ast.walk(arg)):
                found.append((rel, node.lineno, "a pychild argv not given to pychild.run/popen"))
    found += [(rel, line, what) for line, what in process_pools(module, names)]
    return sorted(found, key=lambda f: f[1])


def unreviewed(files, reviewed: Counter = REVIEWED) -> list[str]:
    seen, problems = Counter(), []
    for path in files:
        rel = source_tree.relative(path)
        if rel == THE_MODULE:
            continue
        for _, line, what in interpreter_uses(path, rel):
            if (rel, what) in reviewed:
                seen[(rel, what)] += 1
            else:
                problems.append(f"{rel}:{line}: {what}")
    problems += [f"{rel}: {what} x{seen[(rel, what)]}, reviewed x{n}" for (rel, what), n in sorted(reviewed.items())
                 if seen[(rel, what)] != n]
    return problems


def test_every_python_child_is_built_by_pychild():
    problems = unreviewed(source_tree.audited_files())
    assert not problems, ("a Python started outside minilmd/pychild.py (its import path may then hold a directory "
                          "another user can write), or a review to update:\n" + "\n".join(problems))
    assert interpreter_uses(source_tree.REPO / THE_MODULE, THE_MODULE)  # the scan sees the one place


def test_the_scan_sees_each_way_to_name_a_python(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""python -m x in a docstring is prose."""\nimport os, subprocess, sys as s\n'
                   'from sys import executable as py\n'
                   'def f(events):\n    subprocess.run([s.executable, "-m", "x"])\n'
                   '    subprocess.run([py, "-c", "1"])\n'
                   '    subprocess.run(["python3", "-m", "x"])\n    os.system("torchrun --nproc_per_node 2 x")\n'
                   '    events.emit("python", "a word, not a command")\n', encoding="utf-8")
    assert [(line, what) for _, line, what in interpreter_uses(bad, "bad.py")] == [
        (5, "sys.executable"), (6, "sys.executable"), (7, "python3"), (8, "torchrun")]
    reviewed = Counter({("minilmd/procs.py", "sys.executable"): 2})
    assert unreviewed([bad], reviewed) == ["bad.py:5: sys.executable", "bad.py:6: sys.executable",
                                           "bad.py:7: python3", "bad.py:8: torchrun",
                                           "minilmd/procs.py: sys.executable x0, reviewed x2"]


ESCAPES = """\
import asyncio, os, shutil, subprocess, sys
from minilmd import pychild
from minilmd.pychild import module_argv

def f(script, pid):
    subprocess.run([sys._base_executable, "-m", "x"])
    subprocess.run([os.path.realpath("/proc/self/exe"), "-c", "1"])
    subprocess.run([shutil.which("python3"), "-m", "x"])
    subprocess.run(["/usr/bin/python3", "-m", "x"])
    subprocess.run(["env", "python3", "-m", "x"])
    subprocess.run(f"python3.12 {script}", shell=True)
    asyncio.create_subprocess_exec("python3", "-m", "x")
    os.execv(sys.orig_argv[0], sys.orig_argv)
    os.execlp("python3", "python3", "-m", "x")
    py = "pypy3"; subprocess.run([py, "-m", "x"])
    subprocess.run(pychild.module_argv("minilmd.cli", "prepare"))
    cmd = module_argv("minilmd.cli")
    subprocess.Popen(cmd, cwd="/")
    pychild.run(pychild.module_argv("minilmd.cli", "prepare"))
"""


def test_every_other_spelling_of_a_python_is_seen(tmp_path):
    """The venv's base interpreter, /proc/self/exe, shutil.which, a full path, a Python after env, an f-string, asyncio,
    sys.orig_argv, os.exec*, a name holding the program; and a pychild argv given to subprocess itself (without
    pychild's environment and working directory): each is listed; pychild.run is not."""
    bad = tmp_path / "bad.py"
    bad.write_text(ESCAPES, encoding="utf-8")
    assert [(line, what) for _, line, what in interpreter_uses(bad, "bad.py")] == [
        (6, "sys._base_executable"), (7, "/proc/self/exe"), (8, "shutil.which('python3')"), (9, "python3"),
        (10, "python3"), (11, "python3.12"), (12, "python3"), (13, "sys.orig_argv"), (13, "sys.orig_argv"),
        (14, "python3"), (15, "pypy3"), (16, "a pychild argv not given to pychild.run/popen"),
        (18, "a pychild argv not given to pychild.run/popen")]


POOL_ESCAPES = """\
import concurrent.futures, importlib, multiprocessing as mp
from concurrent import futures
from concurrent.futures import ProcessPoolExecutor as Pool, ThreadPoolExecutor
from multiprocessing import Process, get_context
import torch.multiprocessing

class Workers(Pool):
    pass

def f(work, events):
    mp.get_context("spawn").Process(target=work).start()
    get_context("forkserver").Pool(2)
    Process(target=work).start()
    futures.ProcessPoolExecutor(2)
    concurrent.futures.ProcessPoolExecutor(2)
    mp.set_start_method("spawn")
    torch.multiprocessing.spawn(work, nprocs=2)
    importlib.import_module("multiprocessing").Process(target=work)
    ThreadPoolExecutor(2)
    concurrent.futures.ThreadPoolExecutor(2)
    events.emit("multiprocessing's spawn, in prose")
"""


def test_every_way_to_start_a_python_by_multiprocessing_is_seen(tmp_path):
    """multiprocessing starts Pythons of its own (spawn's and forkserver's `python -c`, in the working directory,
    without pychild's -P or "/"): its contexts, Process, set_start_method, a ProcessPoolExecutor (a base class too),
    torch's multiprocessing, the module imported by a string: each is listed, under any name; threads are not."""
    bad = tmp_path / "bad.py"
    bad.write_text(POOL_ESCAPES, encoding="utf-8")
    assert [(line, what) for _, line, what in interpreter_uses(bad, "bad.py")] == [
        (7, "concurrent.futures.ProcessPoolExecutor"), (11, "multiprocessing.get_context"),
        (12, "multiprocessing.get_context"), (13, "multiprocessing.Process"),
        (14, "concurrent.futures.ProcessPoolExecutor"), (15, "concurrent.futures.ProcessPoolExecutor"),
        (16, "multiprocessing.set_start_method"), (17, "torch.multiprocessing.spawn"), (18, "'multiprocessing'")]


def test_the_code_starts_multiprocessing_workers_in_one_place():
    """The corpus tools' spawn context and pool are reviewed (REVIEWED, exact counts): the scan sees them there."""
    workers = source_tree.REPO / "minilmd" / "corpus" / "workers.py"
    assert {what for _, _, what in interpreter_uses(workers, "minilmd/corpus/workers.py")} == {
        "multiprocessing.get_context", "concurrent.futures.ProcessPoolExecutor"}


def test_pychild_sets_the_environment_and_the_working_directory(tmp_path):
    """pychild.run gives the child PYTHONSAFEPATH=1 and "/", or the caller's directory with keep_cwd; a cwd= of the
    caller's own is refused (it would undo the guard)."""
    code = "import os; print(os.getcwd(), os.environ.get('PYTHONSAFEPATH'))"
    done = pychild.run(pychild.python_argv("-c", code), env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert done.stdout.split() == [pychild.CHILD_CWD, "1"]
    kept = pychild.run(pychild.python_argv("-c", code), keep_cwd=True, capture_output=True, text=True)
    assert kept.stdout.split() == [os.getcwd(), "1"]
    with pytest.raises(TypeError, match="keep_cwd"):
        pychild.run(pychild.python_argv("-c", code), cwd=tmp_path)
