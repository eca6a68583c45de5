"""The layers hold by structure, and the map of them in docs/architecture.md cannot drift.

- `minilmd/` (the torch-free core) and `daemon/` (the supervisor) never import torch, nor anything of
  `minilmd.trainer`: checked on the import statements of every module (module level and inside functions), and
  at run time by importing every module with torch made unimportable. The one exception is `minilmd/cli.py`, the
  command line, whose trainer commands import their implementation inside the command's body.
- "Where things live" in docs/architecture.md names every package and module there is, and no other.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
TORCH_FREE = {"minilmd": REPO / "minilmd", "minilmd.daemon": REPO / "daemon"}
CODE_FOLDERS = {"minilmd": REPO / "minilmd", "daemon": REPO / "daemon", "trainer": REPO / "trainer"}
PULLS_IN_TORCH = ("torch", "safetensors.torch", "transformers", "peft", "accelerate", "minilmd.trainer")
"""Import names (and their submodules) that load torch, or the trainer that does."""
MAY_REACH_THE_TRAINER = {REPO / "minilmd" / "cli.py"}
"""Modules allowed to import `minilmd.trainer` inside a function body (never at module level)."""


def modules_of(package: str, folder: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        found[".".join([package, *parts])] = path
    return found


def imports(path: Path, module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import statement of a file; relative imports are
    resolved against `module`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
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
    return found


def pulls_in_torch(name: str) -> bool:
    return any(name == bad or name.startswith(bad + ".") for bad in PULLS_IN_TORCH)


def layer_violations() -> list[str]:
    problems = []
    for package, folder in TORCH_FREE.items():
        for module, path in modules_of(package, folder).items():
            for name, line, top in imports(path, module):
                if not pulls_in_torch(name):
                    continue
                lazy_trainer = not top and name.startswith("minilmd.trainer") and path in MAY_REACH_THE_TRAINER
                if not lazy_trainer:
                    where = "module level" if top else "inside a function"
                    problems.append(f"{path.relative_to(REPO)}:{line}: imports {name} ({where})")
    return sorted(set(problems))


def test_the_torch_free_layers_import_neither_torch_nor_the_trainer():
    problems = layer_violations()
    assert not problems, "the core and the supervisor must stay torch-free:\n" + "\n".join(problems)


def test_the_checker_sees_a_violation(tmp_path):
    """The rule can fail: a module that imports torch inside a function, or the trainer at module level."""
    fake = tmp_path / "bad.py"
    fake.write_text("import os\nfrom minilmd.trainer.loop import train\n\ndef f():\n    import torch.nn\n",
                    encoding="utf-8")
    found = [(n, line, top) for n, line, top in imports(fake, "minilmd.bad") if pulls_in_torch(n)]
    assert ("minilmd.trainer.loop.train", 2, True) in found
    assert ("torch.nn", 5, False) in found
    rel = tmp_path / "pkg" / "mod.py"
    rel.parent.mkdir()
    rel.write_text("from ..trainer import model\n", encoding="utf-8")
    assert ("minilmd.trainer.model", 1, True) in imports(rel, "minilmd.pkg.mod")


@pytest.mark.parametrize("package", sorted(TORCH_FREE))
def test_every_module_imports_with_torch_unimportable(package):
    """The run-time side of the rule: each module of the layer imports in a process where `import torch`
    fails (third-party modules that would load torch are caught too)."""
    modules = sorted(modules_of(package, TORCH_FREE[package]))
    code = ("import sys, importlib\n"
            "for name in ('torch', 'transformers', 'safetensors.torch'): sys.modules[name] = None\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "assert not any(m == 'minilmd.trainer' or m.startswith('minilmd.trainer.') for m in sys.modules), "
            "[m for m in sys.modules if m.startswith('minilmd.trainer')]\n"
            "print('ok', len(%r))" % (modules,))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-2000:]


# --- "Where things live" ---------------------------------------------------------------------------------------

TREE_LINE = re.compile(r"^(?P<indent> *)(?P<name>[\w.]+/?)(?:\s{2,}(?P<what>\S.*))?$")


def documented_paths() -> dict[str, str]:
    """{path relative to the repo: its description} from the code block of the section "Where things live"."""
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"^## Where things live\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"{DOC.name} has no section '## Where things live'"
    block = re.search(r"^```text\n(.*?)^```", m.group(1), re.S | re.M)
    assert block, "the section 'Where things live' has no ```text block"
    paths: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        lm = TREE_LINE.match(line)
        assert lm, f"not a tree line: {line!r}"
        indent, name = len(lm.group("indent")), lm.group("name")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([p for _, p in stack] + [name.rstrip("/")])
        assert lm.group("what"), f"{path}: no description"
        paths[path + ("/" if name.endswith("/") else "")] = lm.group("what")
        if name.endswith("/"):
            stack.append((indent, name.rstrip("/")))
    return paths


def actual_paths() -> set[str]:
    found = set()
    for top, folder in CODE_FOLDERS.items():
        found.add(top + "/")
        for path in folder.rglob("*.py"):
            rel = path.relative_to(REPO)
            if path.name == "__init__.py":
                found.add(str(rel.parent) + "/")
            else:
                found.add(str(rel))
    return found


def skeleton(paths: set[str]) -> str:
    """The tree as the doc should have it (descriptions to write by hand), printed on a drift."""
    lines = []
    for p in sorted(paths, key=lambda s: s.rstrip("/").split("/")):
        depth = p.rstrip("/").count("/")
        name = p.rstrip("/").split("/")[-1] + ("/" if p.endswith("/") else "")
        lines.append(f"{'  ' * depth}{name:<{30 - 2 * depth}}  ...")
    return "\n".join(lines)


def test_where_things_live_names_every_module():
    documented, actual = set(documented_paths()), actual_paths()
    missing, stale = sorted(actual - documented), sorted(documented - actual)
    assert not missing and not stale, (f"not in 'Where things live': {missing}; there but gone: {stale}. "
                                       f"The tree as it is:\n{skeleton(actual)}")
