"""Exit statuses by name: minilmd/protocol.py is their one home (SUPERVISOR_RETRY, the supervisor's "failed, retry
later" that systemd restarts on; COMMAND_FAILED; EXIT_CONFIG...). A bare number elsewhere agrees with the table only
until one of them changes (house9 item 8: the supervisor's 1 was written as a bare 1 in five places, plot's 1 and 2,
the export's ExportError.exit_status). The audit, over the code and the scripts (source_tree.audited_files), flags an
int literal other than 0 (or one branch of `a if c else b`):
- passed to typer.Exit, SystemExit, sys.exit, os._exit or the supervisor's `_fail` (first argument or code=);
- assigned to an `exit_status` (an attribute, or a class's field);
- returned from a `main` (or `*_main`) function.
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


def bare_statuses(module: ast.Module) -> list[tuple[int, str]]:
    """(line, the statement as written) of each exit status written as a number."""
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
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name == "main" or node.name.endswith("_main")):
            found += [(r.lineno, r) for r in ast.walk(node) if isinstance(r, ast.Return) and _bare_status(r.value)]
    return sorted((line, ast.unparse(node)) for line, node in found)


def test_no_exit_status_is_a_bare_number_outside_protocol():
    found = {f"{source_tree.relative(path)}:{code}": line
             for path in source_tree.audited_files() if source_tree.relative(path) != THE_MODULE
             for line, code in bare_statuses(source_tree.tree(path))}
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
