"""The import statements of the code's modules, read without importing anything (ast): the guards of the layout
use them (test_layers: torch-free layers, the command line's imports; test_import_graph: no import cycle)."""
from __future__ import annotations

import ast
from pathlib import Path

import audit_calls
import source_tree

REPO = source_tree.REPO


def modules_of(package: str, folder: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        found[".".join([package, *parts])] = path
    return found


DYNAMIC = "<a name not spelled out>"
"""What `importlib.import_module(name)` or `__import__(name)` imports when its name is not a literal."""


def dynamic_imports(tree: ast.Module) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for each importlib.import_module / __import__ call (under any name
    they were imported as): its literal name, or DYNAMIC when it is computed; module level unless in a function."""
    aliases = audit_calls.qualified_names(tree)
    in_functions = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                      ast.Lambda)) for n in ast.walk(fn)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = "__import__" if isinstance(node.func, ast.Name) and node.func.id == "__import__" \
            and node.func.id not in aliases else audit_calls.dotted(node.func, aliases)
        if name in ("importlib.import_module", "__import__", "builtins.__import__"):
            arg = node.args[0]
            literal = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else DYNAMIC
            found.append((literal, node.lineno, id(node) not in in_functions))
    return found


def imports(path: Path, module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import statement of a file, and every import_module /
    __import__ call (dynamic_imports); relative imports are resolved against `module`."""
    tree = source_tree.tree(path)
    top_level = {id(node) for node in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` / try blocks at module level still run at import
        if isinstance(node, (ast.If, ast.Try)):
            top_level |= {id(n) for n in ast.walk(node)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found += [(f"{base}.{a.name}" if a.name != "*" else base, node.lineno, id(node) in top_level)
                      for a in node.names]
            found.append((base, node.lineno, id(node) in top_level))
    text = source_tree.source(path)
    return found + (dynamic_imports(tree) if "import_module" in text or "__import__" in text else [])
