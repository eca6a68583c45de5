"""The project's own source files, each read and parsed once per test process: the guards of the layout and of the
rules (test_layers, test_import_graph, test_names, test_owner_rule and the audits of calls) all walk the whole
tree, and used to read and parse it again each."""
from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODE_FOLDERS = ("minilmd", "daemon", "trainer")
"""The folders of the distribution's code (pyproject.toml's package-dir)."""
SCRIPT_FOLDERS = ("scripts", "deploy")
"""Folders of Python scripts run from the checkout (the device checks, the deployment's helpers): the audits of
calls read them too."""


@cache
def code_files(*folders: str) -> tuple[Path, ...]:
    """Every .py file below the given folders of the repository (all of CODE_FOLDERS when none are named)."""
    return tuple(path for folder in folders or CODE_FOLDERS for path in sorted((REPO / folder).rglob("*.py")))


@cache
def audited_files() -> tuple[Path, ...]:
    """The one list of files the audits of calls read (signals, by-path writes, Python children): the code's .py
    files and the scripts' (.py, and those without a suffix that start `#!/usr/bin/env python`)."""
    scripts = [path for folder in SCRIPT_FOLDERS for path in sorted((REPO / folder).rglob("*"))
               if path.is_file() and "__pycache__" not in path.parts
               and (path.suffix == ".py" or (path.suffix == "" and _python_shebang(path)))]
    return code_files() + tuple(scripts)


def relative(path: Path) -> str:
    """A file's name in a finding: its path in the repository, or its own name for a test's tmp_path file."""
    path = Path(path)
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name


def _python_shebang(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(64).startswith(b"#!/usr/bin/env python")


def source(path: Path) -> str:
    """The text of a file: cached for the repository's files, read afresh for any other (a test's tmp_path)."""
    path = Path(path)
    return _cached_source(path) if path.is_relative_to(REPO) else path.read_text(encoding="utf-8")


def tree(path: Path) -> ast.Module:
    """The parsed module (ast), on the same terms as source()."""
    path = Path(path)
    return _cached_tree(path) if path.is_relative_to(REPO) else ast.parse(source(path), filename=str(path))


@cache
def _cached_source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@cache
def _cached_tree(path: Path) -> ast.Module:
    return ast.parse(_cached_source(path), filename=str(path))
