"""No import cycle between the modules of minilmd/, daemon/ and trainer/, counting the imports inside functions.

A function-level import that closes a cycle works only by luck of the order in which things are first imported, and
hides that two modules are one concern split wrongly: the shared piece belongs in a module both can import. The
graph is built from the import statements (tests/import_helpers.py reads them); every strongly connected component of
more than one module is reported with the import lines that tie it together.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import audit_calls
import source_tree
from import_helpers import REPO, imports, modules_of

PACKAGES = {"minilmd": REPO / "minilmd", "minilmd.daemon": REPO / "daemon", "minilmd.trainer": REPO / "trainer"}


def module_files(packages: dict[str, Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in packages.items():
        found.update(modules_of(package, folder))
    return found


def target(name: str, known: dict[str, Path]) -> str | None:
    """The module of ours an imported name lands in: the longest known module prefix (`from a.b import f` -> a.b)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in known:
            return candidate
    return None


def type_checking_lines(path: Path) -> set[int]:
    """Lines inside `if TYPE_CHECKING:` blocks, typing's TYPE_CHECKING (`from typing import TYPE_CHECKING`, under
    any name, or `typing.TYPE_CHECKING`): imports for annotations only, never run, so never a cycle. A TYPE_CHECKING
    of the module's own (`TYPE_CHECKING = True`) runs its block: its imports count."""
    if "TYPE_CHECKING" not in source_tree.source(path):
        return set()
    module = source_tree.tree(path)
    names = audit_calls.qualified_names(module)
    assigned = {t.id for n in ast.walk(module) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    lines: set[int] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.If) and audit_calls.dotted(node.test, names) == "typing.TYPE_CHECKING" and not (
                isinstance(node.test, ast.Name) and node.test.id in assigned):
            lines |= {n.lineno for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno")}
    return lines


def import_graph(known: dict[str, Path], annotations: bool = False) -> dict[str, dict[str, list[int]]]:
    """{module: {imported module of ours: [line, ...]}}, module-level and function-level imports alike (those
    under `if TYPE_CHECKING:` excepted, unless `annotations`)."""
    graph: dict[str, dict[str, list[int]]] = {}
    for module, path in known.items():
        edges: dict[str, list[int]] = {}
        typing_only = set() if annotations else type_checking_lines(path)
        for name, line, _ in imports(path, module):
            dest = target(name, known)
            if line in typing_only:
                continue
            if dest is not None and dest != module and line not in edges.setdefault(dest, []):
                edges[dest].append(line)
        graph[module] = {dest: lines for dest, lines in edges.items() if lines}
    return graph


def cycles(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def describe(component: list[str], graph: dict[str, dict[str, list[int]]], known: dict[str, Path],
             root: Path = REPO) -> str:
    members = set(component)
    lines = [f"cycle of {len(component)} modules: {', '.join(component)}"]
    for module in component:
        for dest, at in sorted(graph[module].items()):
            if dest in members:
                where = ", ".join(str(n) for n in at)
                lines.append(f"  {known[module].relative_to(root)}:{where} imports {dest}")
    return "\n".join(lines)


def test_no_import_cycle():
    known = module_files(PACKAGES)
    graph = import_graph(known)
    found = cycles(graph)
    assert not found, "import cycles (move the shared piece to where it belongs):\n" + "\n".join(
        describe(c, graph, known) for c in found)


ANNOTATION_CYCLES_LEFT = [["minilmd.trainer.loop.resume", "minilmd.trainer.loop.train"]]
"""resume.py names the Trainer only for its annotations (issue 43: once resume() returns what it found and the
Trainer applies it, this goes; remove the entry then)."""


def test_no_cycle_through_annotations_either():
    """An import for annotations only still ties two modules into one concern (config <-> config_values was one:
    the schema now sits below both, minilmd/config_sections.py)."""
    known = module_files(PACKAGES)
    graph = import_graph(known, annotations=True)
    found = [c for c in cycles(graph) if c not in ANNOTATION_CYCLES_LEFT]
    assert not found, "cycles through annotation-only imports:\n" + "\n".join(
        describe(c, graph, known) for c in found)


def test_the_checker_catches_a_function_level_cycle(tmp_path):
    """A package whose two modules import each other, one of them only inside a function, is a cycle; a third
    module that imports one of them without being imported back is not in it."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "a.py").write_text("from pkg.b import g\n\n\ndef f():\n    return g()\n", encoding="utf-8")
    (pkg / "b.py").write_text("def g():\n    from pkg import a\n    return a\n", encoding="utf-8")
    (pkg / "c.py").write_text("from . import a\n", encoding="utf-8")
    known = module_files({"pkg": pkg})
    graph = import_graph(known)
    assert graph["pkg.a"] == {"pkg.b": [1]} and graph["pkg.b"] == {"pkg.a": [2], "pkg": [2]}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    report = describe(["pkg.a", "pkg.b"], graph, known, tmp_path)
    assert "pkg/b.py:2 imports pkg.a" in report and "pkg/a.py:1 imports pkg.b" in report
    (pkg / "b.py").write_text("def g():\n    return 1\n", encoding="utf-8")
    assert cycles(import_graph(module_files({"pkg": pkg}))) == []
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n",
                              encoding="utf-8")  # an annotation-only import back: a cycle only when counted
    assert cycles(import_graph(module_files({"pkg": pkg}))) == []
    assert cycles(import_graph(module_files({"pkg": pkg}), annotations=True)) == [["pkg.a", "pkg.b"]]


def test_only_typings_type_checking_hides_an_import(tmp_path):
    """`if TYPE_CHECKING:` with a TYPE_CHECKING of the module's own (True: the block runs) or one never imported
    from typing hides nothing: the cycle through it is found; typing's, under any spelling, is honoured."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "b.py").write_text("from pkg import a\n", encoding="utf-8")
    for head, hidden in (("TYPE_CHECKING = True\n", False), ("from other import TYPE_CHECKING\n", False),
                         ("from typing import TYPE_CHECKING\nTYPE_CHECKING = True\n", False),
                         ("from typing import TYPE_CHECKING\n", True), ("import typing as t\n", True)):
        test = "t.TYPE_CHECKING" if "typing as t" in head else "TYPE_CHECKING"
        (pkg / "a.py").write_text(f"{head}if {test}:\n    from pkg import b\n", encoding="utf-8")
        found = cycles(import_graph(module_files({"pkg": pkg})))
        assert found == ([] if hidden else [["pkg.a", "pkg.b"]]), head


def test_finding_checkpoints_loads_no_numpy():
    """`minilmd status` finds checkpoints (and init.from's lineage) through these modules: importing them must not
    pull in numpy (~100 ms), which only validating a checkpoint's tensors needs."""
    code = ("import sys\n"
            "import minilmd.checkpoint_dirs, minilmd.init_source, minilmd.daemon.phases.initwait\n"
            "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith('numpy.')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout[-500:], done.stderr[-2000:])
