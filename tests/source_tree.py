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


@cache
def code_files(*folders: str) -> tuple[Path, ...]:
    """Every .py file below the given folders of the repository (all of CODE_FOLDERS when none are named)."""
    return tuple(path for folder in folders or CODE_FOLDERS for path in sorted((REPO / folder).rglob("*.py")))


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
