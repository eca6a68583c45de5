"""Whether a trainer is supervised is decided in one place: minilmd/supervision.py, the one reader of MINILMD_RUN_DIR
and MINILMD_SUPERVISOR_PROCESS. Before, nine places asked `os.environ.get(RUN_DIR_ENV)` each, and the supervisor's
identity was parsed apart from it: a trainer with the first and not the second trained "supervised", pruning nothing,
with nobody watching it (house9 #4).

The audit lists, over the code and the scripts (source_tree.audited_files), every read of either variable outside
supervision.py, on any mapping (os.environ, an `environ` given, a copy of it): `.get(KEY)`, `.pop`, `.setdefault`,
`os.getenv(KEY)` (imported bare too), `m[KEY]`, `KEY in m`; KEY spelled as the names.py constant (under any module,
or a module-level alias of it) or as its literal string. And every write of either outside daemon/child/, which sets
them on the trainer it launches: `m[KEY] = ...`, `del m[KEY]`, `{KEY: ...}`. A read of another process's
environment, which is not this process's supervision, is listed in REVIEWED with why and how many.
"""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import audit_calls
import source_tree
from minilmd import names

THE_MODULE = "minilmd/supervision.py"
SETTERS = "daemon/child/"
KEY_NAMES = {"RUN_DIR_ENV", "SUPERVISOR_PROCESS_ENV"}
KEY_STRINGS = {names.RUN_DIR_ENV, names.SUPERVISOR_PROCESS_ENV}
READ_METHODS = {"get", "pop", "setdefault", "getenv", "getenvb"}
REVIEWED = Counter({
    ("minilmd/procs.py", "env.get(names.RUN_DIR_ENV)"): 1,  # /proc/PID/environ of a process found: one of the run's?
    ("daemon/child/process.py", "env[RUN_DIR_ENV]"): 1,  # the trainer's environment launch() has just set
})
"""Reads that are not this process's supervision, each with how many: one more (a new read to review) or one fewer
(a stale entry) fails."""


def _aliases(module: ast.Module) -> set[str]:
    """Names bound to a key anywhere in the module (`RUN_DIR_ENV = names.RUN_DIR_ENV`, `KEY = "MINILMD_RUN_DIR"`,
    `from minilmd.names import RUN_DIR_ENV as R`), to a fixed point."""
    found = {a.asname for node in audit_calls.nodes(module) if isinstance(node, ast.ImportFrom) for a in node.names
             if a.name in KEY_NAMES and a.asname}
    while True:
        more = {t.id for node in audit_calls.nodes(module)
                if isinstance(node, ast.Assign) and _is_key(node.value, found)
                for t in node.targets if isinstance(t, ast.Name)} - found
        if not more:
            return found
        found |= more


def _is_key(node: ast.AST | None, aliases: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in KEY_STRINGS
    if isinstance(node, ast.Name):
        return node.id in KEY_NAMES | aliases
    return isinstance(node, ast.Attribute) and node.attr in KEY_NAMES


def uses(path: Path) -> list[tuple[int, str, str]]:
    """(line, "read" or "write", the expression) of each read or write of a key in `path`."""
    module = source_tree.tree(path)
    aliases = _aliases(module)
    found = []
    for node in audit_calls.nodes(module):
        if isinstance(node, ast.Call) and node.args and _is_key(node.args[0], aliases) and (
                isinstance(node.func, ast.Attribute) and node.func.attr in READ_METHODS
                or isinstance(node.func, ast.Name) and node.func.id in {"getenv", "getenvb"}):
            found.append((node.lineno, "read", ast.unparse(node)))
        elif isinstance(node, ast.Subscript) and _is_key(node.slice, aliases):
            found.append((node.lineno, "read" if isinstance(node.ctx, ast.Load) else "write", ast.unparse(node)))
        elif isinstance(node, ast.Compare) and _is_key(node.left, aliases) and any(
                isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            found.append((node.lineno, "read", ast.unparse(node)))
        elif isinstance(node, ast.Dict) and any(_is_key(k, aliases) for k in node.keys):
            found.append((node.lineno, "write", ast.unparse(node)[:80]))
    return sorted(found)


def outside_the_module(files: list[Path], reviewed: Counter = REVIEWED) -> list[str]:
    problems, seen = [], Counter()
    for path in files:
        rel = source_tree.relative(path)
        if rel == THE_MODULE:
            continue
        for line, kind, expression in uses(path):
            if kind == "write" and rel.startswith(SETTERS):
                continue
            if kind == "read" and (rel, expression) in reviewed:
                seen[(rel, expression)] += 1
                continue
            problems.append(f"{rel}:{line}: {kind} {expression}")
    problems += [f"{rel}: {expression} {count} time(s) in REVIEWED, {seen[(rel, expression)]} found"
                 for (rel, expression), count in reviewed.items() if seen[(rel, expression)] != count
                 and any(source_tree.relative(p) == rel for p in files)]
    return problems


def test_only_supervision_py_reads_the_supervisors_variables():
    problems = outside_the_module(list(source_tree.audited_files()))
    assert not problems, ("MINILMD_RUN_DIR or MINILMD_SUPERVISOR_PROCESS used outside minilmd/supervision.py: ask "
                          "supervision() (None: not supervised), or list a read of another process's environment "
                          "in REVIEWED with why:\n" + "\n".join(problems))


def test_the_audit_sees_every_spelling(tmp_path):
    """Each way the nine old sites, and the ways around them, spell a read: found; another variable: not."""
    code = tmp_path / "site.py"
    code.write_text(
        "import os\nfrom os import getenv\nfrom minilmd import names\nfrom minilmd.names import RUN_DIR_ENV\n"
        "from minilmd.names import SUPERVISOR_PROCESS_ENV as WHO\n"
        "ALIAS = names.RUN_DIR_ENV\n"
        "def f(environ=os.environ):\n"
        "    a = os.environ.get(RUN_DIR_ENV)\n"                    # 8
        "    b = bool(environ.get(names.RUN_DIR_ENV))\n"            # 9
        "    c = environ.get(WHO, '').split()\n"                    # 10
        "    d = os.getenv('MINILMD_RUN_DIR')\n"                     # 11
        "    e = getenv(ALIAS)\n"                                    # 12
        "    g = os.environ[names.SUPERVISOR_PROCESS_ENV]\n"        # 13
        "    h = 'MINILMD_SUPERVISOR_PROCESS' in environ\n"          # 14
        "    os.environ[RUN_DIR_ENV] = '/x'\n"                       # 15
        "    env = {**os.environ, names.RUN_DIR_ENV: '/x'}\n"        # 16
        "    return os.environ.get(names.LAUNCH_ID_ENV), os.environ['MINILMD_LAUNCH_ID'], a, b, c, d, e, g, h, env\n",
        encoding="utf-8")
    found = outside_the_module([code], Counter())
    assert [p.split(":")[1] for p in found] == [str(n) for n in range(8, 17)], found
    assert found[7].endswith("write os.environ[RUN_DIR_ENV]") and found[8].startswith("site.py:16: write {"), found
    assert outside_the_module([code], Counter({("site.py", "os.environ.get(RUN_DIR_ENV)"): 2}))[-1] == \
        "site.py: os.environ.get(RUN_DIR_ENV) 2 time(s) in REVIEWED, 1 found"
