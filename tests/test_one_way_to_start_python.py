"""Every Python process minilmd starts is built by minilmd/pychild.py (`-P`, PYTHONSAFEPATH, the working directory
"/"), so that no directory another user can write comes first on its import path.

The test lists each use of the running interpreter's path (`sys.executable`, `from sys import executable` under any
name) and each command that names a Python or torchrun by a string in code (an argv's first element, or the first
word of a shell string) outside pychild.py, and fails on one that is not reviewed below, with its reason. A new
way to start Python goes through pychild.python_argv / module_argv, or is added here with why it is safe.
"""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import source_tree

THE_MODULE = "minilmd/pychild.py"
PYTHONS = {"python", "python3", "torchrun", "python3.10", "python3.11", "python3.12", "python3.13"}
REVIEWED = Counter({
    # exec of this same process (same pid) with the supervisor's identity in its environment: sys.orig_argv keeps
    # the flags it was started with, and the `minilmd` console script's sys.path[0] is the venv's bin/
    ("minilmd/procs.py", "sys.executable"): 2,
})


SHELL_RUNNERS = {"system", "popen", "run", "Popen", "call", "check_call", "check_output", "getoutput",
                 "getstatusoutput"}


def _runner(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def interpreter_uses(path: Path, rel: str) -> list[tuple[str, int, str]]:
    """(file, line, what) of each use of the interpreter's path, and of each Python named by a string as a command."""
    module = source_tree.tree(path)
    bare = {alias.asname or alias.name for node in ast.walk(module)
            if isinstance(node, ast.ImportFrom) and node.module == "sys" for alias in node.names
            if alias.name == "executable"}
    sys_names = {"sys"} | {alias.asname for node in ast.walk(module) if isinstance(node, ast.Import)
                           for alias in node.names if alias.name == "sys" and alias.asname}
    found = []
    for node in ast.walk(module):
        if isinstance(node, ast.Attribute) and node.attr == "executable" and isinstance(node.value, ast.Name) \
                and node.value.id in sys_names:
            found.append((rel, node.lineno, "sys.executable"))
        elif isinstance(node, ast.Name) and node.id in bare and isinstance(node.ctx, ast.Load):
            found.append((rel, node.lineno, "sys.executable"))
        elif isinstance(node, (ast.List, ast.Tuple)) and node.elts and isinstance(node.elts[0], ast.Constant) \
                and isinstance(node.elts[0].value, str) and node.elts[0].value in PYTHONS:
            found.append((rel, node.lineno, node.elts[0].value))
        elif isinstance(node, ast.Call) and _runner(node.func) in SHELL_RUNNERS and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                and node.args[0].value.split()[:1] and node.args[0].value.split()[0] in PYTHONS:
            found.append((rel, node.lineno, node.args[0].value.split()[0]))
    return sorted(found, key=lambda f: f[1])


def unreviewed(files, reviewed: Counter = REVIEWED) -> list[str]:
    seen, problems = Counter(), []
    for path in files:
        rel = path.relative_to(source_tree.REPO).as_posix() if path.is_relative_to(source_tree.REPO) else path.name
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
    problems = unreviewed(source_tree.code_files())
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
    assert unreviewed([bad]) == ["bad.py:5: sys.executable", "bad.py:6: sys.executable", "bad.py:7: python3",
                                 "bad.py:8: torchrun", "minilmd/procs.py: sys.executable x0, reviewed x2"]
