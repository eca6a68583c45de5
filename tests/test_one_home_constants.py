"""One home for each constant: a module-level constant defined twice with the same value (IGNORE_INDEX = -100 in the
sampler that writes the labels and in the loss that ignores them; OPEN_DIR, PRIVATE, PASS_STEP) agrees only until one
of them changes, and nothing then says the other should have. The audit lists, over the code and the scripts
(source_tree.audited_files):
- a name assigned at module level in two modules with the same definition (as ast.unparse writes it);
- a set of os.O_* flags written at module level in two modules, under any names (untrusted.OPEN_FLAGS was written
  again as OPEN_SOURCE and OPEN_OLD).
- O_NOFOLLOW and O_NONBLOCK named together in one `|` anywhere but minilmd/openflags.py, their one home
  (OPEN_FLAGS, NO_FOLLOW_NO_BLOCK): scratch_hold's MARKER_OPEN, perms' and compilecache's opens spelled them inline,
  without O_NOCTTY.
A constant that is one module's own business and merely shares another's spelling is listed in LOCAL, with why.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import audit_calls
import source_tree

LOCAL: dict[str, str] = {
    "GIB": "a unit of the module's own words or arithmetic (1024 ** 3 wherever written), not a setting",
    "ROOT": "a script's own repository root, found from its own file",
    "VERSION": "the format version of each module's own file (a checkpoint's manifest, a corpus's meta.json): both "
               "1 today, each bumped on its own",
}
"""Names whose same definition in two modules is intended: each module's own, nothing links the two."""


def _constants(path: Path) -> list[tuple[str, ast.expr, int]]:
    """(name, value, line) of each module-level `NAME = value` (NAME in upper case) of `path`."""
    found = []
    for node in source_tree.tree(path).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name) and target.id.lstrip("_").isupper() and node.value is not None:
                found.append((target.id, node.value, node.lineno))
    return found


def _open_flags(value: ast.expr) -> frozenset[str] | None:
    """The os.O_* names of `os.O_A | os.O_B | ...`, None for anything else."""
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "os" \
            and value.attr.startswith("O_"):
        return frozenset({value.attr})
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):
        left, right = _open_flags(value.left), _open_flags(value.right)
        return left | right if left is not None and right is not None else None
    return None


def defined_twice(files: list[Path], local: dict[str, str] = LOCAL) -> list[str]:
    by_definition: dict[tuple[str, str], list[str]] = defaultdict(list)
    by_flags: dict[frozenset[str], list[str]] = defaultdict(list)
    for path in files:
        rel = source_tree.relative(path)
        for name, value, line in _constants(path):
            if name not in local:
                by_definition[(name, ast.unparse(value))].append(f"{rel}:{line}")
            if (flags := _open_flags(value)) is not None and len(flags) > 1:
                by_flags[flags].append(f"{rel}:{line} {name}")
    found = [f"{name} = {value}: {', '.join(where)}" for (name, value), where in sorted(by_definition.items())
             if len({w.split(':')[0] for w in where}) > 1]
    found += [f"{' | '.join(sorted(flags))}: {', '.join(where)}" for flags, where in sorted(
        by_flags.items(), key=lambda item: sorted(item[0])) if len({w.split(':')[0] for w in where}) > 1]
    return found


FLAGS_HOME = "minilmd/openflags.py"
NO_LINK_NO_BLOCK = {"O_NOFOLLOW", "O_NONBLOCK"}


def _or_flags(value: ast.expr, names: dict[str, str]) -> set[str]:
    """The os.O_* flags an `a | b | ...` names (os.O_X, or O_X imported from os under any name)."""
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):
        return _or_flags(value.left, names) | _or_flags(value.right, names)
    name = audit_calls.dotted(value, names) or ""
    return {name[len("os."):]} if name.startswith("os.O_") else set()


def flags_spelled_inline(files: list[Path]) -> list[str]:
    """file:line of each `|` naming O_NOFOLLOW and O_NONBLOCK outside FLAGS_HOME, at module level or in a call."""
    found = set()
    for path in files:
        rel = source_tree.relative(path)
        module = source_tree.tree(path)
        names = audit_calls.qualified_names(module)
        found |= {f"{rel}:{node.lineno}" for node in audit_calls.nodes(module) if rel != FLAGS_HOME
                  and isinstance(node, ast.BinOp) and NO_LINK_NO_BLOCK <= _or_flags(node, names)}
    return sorted(found)


def test_each_constant_has_one_home():
    problems = defined_twice(list(source_tree.audited_files()))
    assert not problems, ("a constant defined again in another module: import it from its one home (or, when it "
                          "is truly the module's own, list it in LOCAL with why):\n" + "\n".join(problems))


def test_the_open_flags_of_a_file_others_may_have_made_have_one_home():
    problems = flags_spelled_inline(list(source_tree.audited_files()))
    assert not problems, (f"O_NOFOLLOW | O_NONBLOCK spelled again: open with {FLAGS_HOME}'s OPEN_FLAGS (a read) or "
                          "NO_FOLLOW_NO_BLOCK with the access mode (a write):\n" + "\n".join(problems))


def test_the_audit_sees_the_open_flags_spelled_inline_under_any_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os as o\nfrom os import O_NONBLOCK as NB\nOPEN = o.O_RDONLY | o.O_NOFOLLOW | NB\n"
                      "def f(p):\n    return o.open(p, o.O_WRONLY | o.O_NOFOLLOW | o.O_NONBLOCK)\n"
                      "DIR = o.O_RDONLY | o.O_NOFOLLOW | o.O_DIRECTORY\n", encoding="utf-8")
    assert flags_spelled_inline([sample]) == ["sample.py:3", "sample.py:5"]


def test_the_audit_sees_a_constant_and_a_flag_set_written_twice(tmp_path):
    one, two = tmp_path / "one.py", tmp_path / "two.py"
    one.write_text("import os\nIGNORE_INDEX = -100\nOPEN = os.O_RDONLY | os.O_NOFOLLOW\nVERSION = 1\n"
                   "SHOWN = 3\n", encoding="utf-8")
    two.write_text("import os\nIGNORE_INDEX = -100\nFLAGS = os.O_NOFOLLOW | os.O_RDONLY\nVERSION = 1\n"
                   "SHOWN = 5\ndef f():\n    IGNORE = -100\n", encoding="utf-8")
    assert defined_twice([one, two]) == ["IGNORE_INDEX = -100: one.py:2, two.py:2",
                                         "O_NOFOLLOW | O_RDONLY: one.py:3 OPEN, two.py:3 FLAGS"]
