"""Exit statuses by name: minilmd/protocol.py is their one home (SUPERVISOR_RETRY, the supervisor's "failed, retry
later" that systemd restarts on; COMMAND_FAILED; EXIT_CONFIG...). A bare number elsewhere agrees with the table only
until one of them changes (house9 item 8: the supervisor's 1 was written as a bare 1 in five places, plot's 1 and 2,
the export's ExportError.exit_status). The audit, over the code and the scripts (source_tree.audited_files), flags an
int literal other than 0 (or one branch of `a if c else b`):
- passed to typer.Exit, SystemExit, sys.exit, os._exit or the supervisor's `_fail` (first argument or code=);
- assigned to an `exit_status` (an attribute, or a class's field);
- returned from a `main` (or `*_main`) function, or from a function whose result is an exit status: one called as
  the status of one of those calls (`typer.Exit(forget(run))`), or one such a function returns the call of
  (`return _forget(...)`), by name across the audited files (status_functions).
REVIEWED lists the sites where a number is right, with why.
"""
from __future__ import annotations

import ast
from pathlib import Path

import source_tree

THE_MODULE = "minilmd/protocol.py"
EXITS = {"Exit", "SystemExit", "exit", "_exit", "_fail"}
"""The calls whose first argument (or code=) is an exit status: typer.Exit, SystemExit, sys.exit, os._exit, and
daemon/ending.py's `_fail(status, message)`."""

REVIEWED: dict[str, str] = {
    "minilmd/corpus/workers.py:os._exit(1)": "a pool worker whose parent is gone ends itself: no one reads its status",
    "scripts/gpu-check:os._exit(3)": "MINILMD_GPU_CHECK_FAIL's injected exit of a part: a test's own number, shown "
                                     "by the check as that part's failure",
}
"""file:call of a number that is right where it is, each with why."""


def _bare_status(node: ast.AST | None) -> bool:
    """An int literal other than 0, or a conditional one of whose branches is."""
    if isinstance(node, ast.IfExp):
        return _bare_status(node.body) or _bare_status(node.orelse)
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value != 0


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _called_names(node: ast.AST | None) -> set[str]:
    """The name of the function `node` calls, or of both branches' calls of `a if c else b`."""
    if isinstance(node, ast.IfExp):
        return _called_names(node.body) | _called_names(node.orelse)
    return {name} if isinstance(node, ast.Call) and (name := _call_name(node)) else set()


def status_functions(modules: list[ast.Module]) -> frozenset[str]:
    """Names of the functions whose result is an exit status: called as an EXITS call's status, then those such a
    function returns the call of (`return _forget(...)`), until no more is found."""
    found: set[str] = set()
    defs: dict[str, list[ast.AST]] = {}
    for module in modules:
        for node in ast.walk(module):
            if isinstance(node, ast.Call) and _call_name(node) in EXITS:
                for value in [*node.args[:1], *(k.value for k in node.keywords if k.arg == "code")]:
                    found |= _called_names(value)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(node.name, []).append(node)
    todo = list(found)
    while todo:
        for function in defs.get(todo.pop(), []):
            for r in ast.walk(function):
                if isinstance(r, ast.Return) and (new := _called_names(r.value) - found - EXITS):
                    found |= new
                    todo += new
    return frozenset(found)


def _returns_status(function: ast.AST, status_funcs: frozenset[str]) -> bool:
    name = function.name  # type: ignore[attr-defined]
    return name == "main" or name.endswith("_main") or name in status_funcs


def bare_statuses(module: ast.Module, status_funcs: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, the statement as written) of each exit status written as a number; `status_funcs`: the names of the
    functions whose result is an exit status besides a main (status_functions)."""
    found: list[tuple[int, ast.AST]] = []
    for node in ast.walk(module):
        if isinstance(node, ast.Call) and _call_name(node) in EXITS:
            given = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "code")]
            if any(_bare_status(value) for value in given):
                found.append((node.lineno, node))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and _bare_status(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any((isinstance(t, ast.Attribute) and t.attr == "exit_status")
                   or (isinstance(t, ast.Name) and t.id == "exit_status") for t in targets):
                found.append((node.lineno, node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _returns_status(node, status_funcs):
            found += [(r.lineno, r) for r in ast.walk(node) if isinstance(r, ast.Return) and _bare_status(r.value)]
    return sorted((line, ast.unparse(node)) for line, node in found)


def test_no_exit_status_is_a_bare_number_outside_protocol():
    paths = [path for path in source_tree.audited_files() if source_tree.relative(path) != THE_MODULE]
    status_funcs = status_functions([source_tree.tree(path) for path in paths])
    found = {f"{source_tree.relative(path)}:{code}": line
             for path in paths for line, code in bare_statuses(source_tree.tree(path), status_funcs)}
    unreviewed = sorted(f"{where} (line {line})" for where, line in found.items() if where not in REVIEWED)
    assert not unreviewed, "name the status in minilmd/protocol.py (SUPERVISOR_RETRY, COMMAND_FAILED, " \
                           "EXIT_CONFIG...):\n" + "\n".join(unreviewed)
    assert set(REVIEWED) <= set(found), f"reviewed but gone (drop them): {sorted(set(REVIEWED) - set(found))}"


def test_the_audit_sees_each_spelling(tmp_path: Path):
    module = tmp_path / "m.py"
    module.write_text("import os, sys, typer\n"
                      "from minilmd import protocol\n"
                      "class E(Exception):\n"
                      "    exit_status = 1\n"                                          # 4
                      "class F(Exception):\n"
                      "    exit_status = protocol.COMMAND_FAILED\n"                    # 6: named
                      "def main(ok):\n"
                      "    if ok:\n"
                      "        return 0\n"                                              # 9: success
                      "    raise typer.Exit(code=0 if ok else 1)\n"                       # 10
                      "def run_main():\n"
                      "    return 2\n"                                                  # 12
                      "def helper():\n"
                      "    return 1\n"                                                  # 14: not a main
                      "def end(self):\n"
                      "    self._fail(1, 'x')\n"                                        # 16
                      "    self.loop.exit_status = 1\n"                                 # 17
                      "    sys.exit(3)\n"                                               # 18
                      "    os._exit(1)\n"                                               # 19
                      "    raise SystemExit(protocol.EXIT_CONFIG)\n")                   # 20: named
    assert [line for line, _ in bare_statuses(source_tree.tree(module))] == [4, 10, 12, 16, 17, 18, 19]


def test_the_audit_follows_a_status_through_the_functions_that_return_it(tmp_path: Path):
    """`typer.Exit(forget(run))`: forget's result is an exit status, and so is _forget's, which it returns."""
    module = tmp_path / "m.py"
    module.write_text("import typer\n"
                      "def forget(target):\n"
                      "    if not target:\n"
                      "        return 2\n"                                              # 4
                      "    return _forget(target)\n"
                      "def _forget(target):\n"
                      "    return 1 if target else 0\n"                                 # 7
                      "def count(xs):\n"
                      "    return 1\n"                                                  # 9: not a status
                      "def cli(run):\n"
                      "    raise typer.Exit(forget(run))\n")
    tree = source_tree.tree(module)
    assert status_functions([tree]) == {"forget", "_forget"}
    assert [line for line, _ in bare_statuses(tree, status_functions([tree]))] == [4, 7]
