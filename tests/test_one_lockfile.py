"""Every flock minilmd takes goes through minilmd/lockfile.py, the one home of the lock-file protocol's checks, and
the kernel's record of who holds one is read in minilmd/procs.py's readers only (minilmd/proc_info.py).

Before, the protocol was written four times with different guards (the trainer's lock followed a hard link, the
leases matched /proc/locks on the inode alone). The test lists every use of fcntl.flock and fcntl.lockf (called or
not, under any import spelling: `import fcntl as f`, `from fcntl import flock as take`, a star import) in the
code and the scripts (source_tree.audited_files) and fails on one outside lockfile.py; and every string that names
/proc/locks as a path outside the readers of /proc. A new lock is taken with lockfile.take, a new look at it
through lockfile's probe_free, holder or read_body.
"""
from __future__ import annotations

import ast
from pathlib import Path

import audit_calls
import source_tree

THE_MODULE = "minilmd/lockfile.py"
LOCK_CALLS = {"fcntl.flock", "fcntl.lockf"}
PROC_READERS = {"minilmd/proc_info.py", "minilmd/procs.py"}


def flock_uses(path: Path) -> list[tuple[str, int, str]]:
    """(file, line, code) of each use of fcntl.flock or fcntl.lockf in `path`, however the module or the function
    was imported."""
    module = source_tree.tree(path)
    names = audit_calls.qualified_names(module)
    rel = source_tree.relative(path)
    found = []
    for node in audit_calls.nodes(module):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                f"{names.get(node.value.id, node.value.id)}.{node.attr}" in LOCK_CALLS:
            found.append((rel, node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Name) and names.get(node.id) in LOCK_CALLS:
            found.append((rel, node.lineno, node.id))
    return found


def _docstrings(module: ast.Module) -> set[int]:
    """The ids of the docstring nodes: prose may name /proc/locks, only code reads it."""
    ids = set()
    for node in audit_calls.nodes(module):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body and \
                isinstance(first := node.body[0], ast.Expr) and isinstance(first.value, ast.Constant):
            ids.add(id(first.value))
    return ids


def proc_locks_paths(path: Path) -> list[tuple[str, int]]:
    """(file, line) of each string (not a docstring) that starts with /proc/locks: a path to read."""
    module = source_tree.tree(path)
    prose = _docstrings(module)
    return [(source_tree.relative(path), node.lineno) for node in audit_calls.nodes(module)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
            and node.value.startswith("/proc/locks")]


def test_flock_is_called_in_lockfile_only():
    outside = [use for path in source_tree.audited_files() for use in flock_uses(path)
               if use[0] != THE_MODULE]
    assert not outside, f"flock outside {THE_MODULE} (take or probe the lock through it): {outside}"
    assert flock_uses(source_tree.REPO / THE_MODULE), "the audit no longer sees lockfile.py's own flock calls"


def test_proc_locks_is_read_by_procs_readers_only():
    outside = [use for path in source_tree.audited_files() for use in proc_locks_paths(path)
               if use[0] not in PROC_READERS]
    assert not outside, f"/proc/locks read outside {sorted(PROC_READERS)} (ask procs.flock_holders): {outside}"
    assert proc_locks_paths(source_tree.REPO / "minilmd" / "proc_info.py"), "the audit no longer sees the reader"


def test_the_audit_sees_every_spelling(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Names /proc/locks in prose: not a read."""\n'
        "import fcntl as f\n"
        "from fcntl import flock as take, lockf\n"
        "from fcntl import *\n"
        "f.flock(0, f.LOCK_EX)\n"
        "take(0, 2)\n"
        "lockf(0, 2)\n"
        "hold = f.flock\n"
        "flock(0, 8)\n"
        "open('/proc/locks').read()\n"
        "words = 'a process /proc/locks does not name'\n")
    uses = sorted((line, code) for _, line, code in flock_uses(sample))
    assert uses == [(5, "f.flock"), (6, "take"), (7, "lockf"), (8, "f.flock"), (9, "flock")], uses
    assert [line for _, line in proc_locks_paths(sample)] == [10]
