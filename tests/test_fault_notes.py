"""fault.json's kinds have one home: protocol.FaultNote, written by the trainer (trainer/loop/exits.py) and read by
the supervisor (daemon/child/death.py) by name. Before, both sides spelled "refused", "scratch_full" and "cuda_oom"
as string literals: a typo on one side moved a death to another Cause and no test noticed (house9 item 5)."""
from __future__ import annotations

import ast

import source_tree
from minilmd import protocol
from minilmd.protocol import FaultNote

NOTE_WORDS = {note.value for note in FaultNote}


def _kind_of(node: ast.expr) -> bool:
    """`x.get("kind")` or `x["kind"]`: a fault's kind read from its dict."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind"
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "kind"


def _spelled_by_hand(path) -> list[str]:
    """Each write_fault call whose kind is not a FaultNote member, each comparison of a dict's "kind" with a
    FaultNote value spelled as a string literal."""
    found = []
    for node in ast.walk(source_tree.tree(path)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "write_fault":
            kind = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "kind"),
                                                                 None)
            if not (isinstance(kind, ast.Attribute) and isinstance(kind.value, (ast.Name, ast.Attribute))
                    and ast.unparse(kind.value).endswith("FaultNote")):
                found.append(f"{source_tree.relative(path)}:{node.lineno}: write_fault({ast.unparse(kind or node)})")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_kind_of(side) for side in sides) and any(
                    isinstance(c, ast.Constant) and c.value in NOTE_WORDS for c in sides):
                found.append(f"{source_tree.relative(path)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_fault_kinds_are_named_by_faultnote_on_both_sides():
    found = [hit for path in source_tree.code_files() if path.name != "protocol.py" for hit in _spelled_by_hand(path)]
    assert not found, "fault.json's kinds are protocol.FaultNote members, never strings:\n" + "\n".join(found)


def test_the_audit_sees_a_kind_spelled_by_hand(tmp_path):
    fake = tmp_path / "bad.py"
    fake.write_text("from minilmd.protocol import FaultNote, write_fault\n"
                    "write_fault(d, FaultNote.REFUSED, 'ok')\n"
                    "write_fault(d, 'cuda_oom', 'typo-prone')\n"
                    "if fault.get('kind') == 'scratch_full':\n    pass\n", encoding="utf-8")
    assert [hit.split(":")[1] for hit in _spelled_by_hand(fake)] == ["3", "4"]


def test_a_note_written_is_read_back_as_its_member_and_an_unknown_kind_as_none(tmp_path):
    for note in FaultNote:
        protocol.write_fault(tmp_path, note, "why", step=3)
        fault = protocol.read_fault(tmp_path)
        assert fault is not None and fault["kind"] == note.value and protocol.fault_note(fault) is note
    assert protocol.fault_note({"kind": "scratch-full"}) is None and protocol.fault_note(None) is None
