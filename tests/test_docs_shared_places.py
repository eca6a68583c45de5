"""docs/failure-modes.md "Shared places": every test the table names exists (its file, and its test function), so
that the table cannot name a test that was renamed or removed; and every row names at least one."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "failure-modes.md"
REFERENCE = re.compile(r"`((?:tests/[\w/]+\.py)?(?:::\w+)?)`")


def shared_places_rows() -> list[list[str]]:
    """The table's rows (header and rule line left out), each as its cells."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Shared places\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert lines[0].startswith("| place |") and set(lines[1]) <= set("|- "), lines[:2]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines[2:]]


def named_tests(cell: str) -> list[tuple[str, str | None]]:
    """(file, test function or None) of each reference in a test cell; `::name` alone is in the file named last."""
    out, current = [], None
    for ref in REFERENCE.findall(cell):
        if not ref:
            continue
        path, _, name = ref.partition("::")
        current = path or current
        assert current, f"{ref!r} names no file before it"
        out.append((current, name or None))
    return out


def functions_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_the_shared_places_table_has_four_columns_and_a_test_in_every_row():
    rows = shared_places_rows()
    assert len(rows) >= 20, len(rows)
    for row in rows:
        assert len(row) == 4, row[0]
        assert named_tests(row[3]), f"the row {row[0]!r} names no test"


def test_every_test_the_shared_places_table_names_exists():
    missing = []
    for row in shared_places_rows():
        for file, name in named_tests(row[3]):
            path = ROOT / file
            if not path.is_file():
                missing.append(f"{row[0]}: {file} does not exist")
            elif name is not None and name not in functions_in(path):
                missing.append(f"{row[0]}: {file} has no {name}")
    assert not missing, "\n".join(missing)


def test_the_check_catches_a_renamed_test():
    cell = "`tests/test_docs_shared_places.py::test_every_test_the_shared_places_table_names_exists`, `::no_such_test`"
    refs = named_tests(cell)
    assert refs == [("tests/test_docs_shared_places.py", "test_every_test_the_shared_places_table_names_exists"),
                    ("tests/test_docs_shared_places.py", "no_such_test")]
    assert refs[1][1] not in functions_in(ROOT / refs[1][0])
