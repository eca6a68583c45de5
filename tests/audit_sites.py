"""What the audits of sites share (tests/write_audit.py's writes by path, tests/listing_audit.py's directory
listings): a visitor that counts what it finds by (function, kind), the walk of source_tree.audited_files() that
gathers those counts per file, and their comparison with a table of reviews."""
from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable

import source_tree


class Scoped(ast.NodeVisitor):
    """A visitor that knows the function (and class) it is in: `count(kind)` counts a site there; `own_method(call)`
    tells `self.name(...)` in a class that defines `name` (the project's own method, read where it is defined)."""

    def __init__(self) -> None:
        self.where: list[str] = []
        self.methods: list[set[str]] = []
        self.found: Counter = Counter()

    def _scope(self, node) -> None:
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _scope

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.methods.append({f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))})
        self._scope(node)
        self.methods.pop()

    def own_method(self, fn: ast.expr) -> bool:
        """`self.open` in a class that defines open: a method of the project, whose own calls are read where it is
        defined (Remote.open), not a library's."""
        return bool(self.methods) and isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and \
            fn.value.id == "self" and fn.attr in self.methods[-1]

    def count(self, kind: str) -> None:
        self.found[(".".join(self.where) or "<module>", kind)] += 1


def sites(found_in: Callable[[str, ast.Module], Counter], skip: str) -> dict[str, Counter]:
    """{file: Counter((function, kind))} of each audited file (its repository path) but `skip` where `found_in`
    (its path, its parsed module) finds anything."""
    found = {}
    for path in source_tree.audited_files():
        name = path.relative_to(source_tree.REPO).as_posix()
        if name != skip and (counted := found_in(name, source_tree.tree(path))):
            found[name] = counted
    return found


def differences(found: dict[str, Counter], reviewed: dict) -> list[str]:
    """Each (module, function, kind) whose count differs from its review (reviewed: {module: (place, reason,
    {(function, kind): count})}): a new site, or a stale review."""
    problems = []
    for module in sorted(set(found) | set(reviewed)):
        have, allowed = found.get(module, Counter()), reviewed.get(module, ("", "", {}))[2]
        for key in sorted(set(have) | set(allowed)):
            if have[key] != allowed.get(key, 0):
                problems.append(f"{module}: {key[0]}: {key[1]} x{have[key]} (reviewed: {allowed.get(key, 0)})")
    return problems


def unexplained(reviewed: dict) -> list[str]:
    """The modules of a review table whose review lacks its place ("private" or "gap"), a reason of some words, or
    a count above zero for each site."""
    return [module for module, (place, reason, allowed) in reviewed.items()
            if place not in ("private", "gap") or len(reason) <= 20 or not allowed or min(allowed.values()) < 1]
