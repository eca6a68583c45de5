"""docs/architecture.md and docs/operations.md cannot drift from the code: the mermaid state diagram is the
transition table of daemon/base/states.py edge for edge, the phase table names every phase, the claim that daemon/
never imports torch holds, and the runbook's tables name every restart cause of daemon/child/death.py and every exit
status of minilmd/protocol.py."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from minilmd import protocol
from minilmd.daemon.base.states import FINAL_PHASES, INITIAL_PHASES, LAUNCH_PHASES, TRANSITIONS, Phase, first_phase
from minilmd.daemon.child.death import CAUSES

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
RUNBOOK = REPO / "docs" / "operations.md"
STARTS = INITIAL_PHASES | LAUNCH_PHASES
"""Where a run's record starts: a supervisor's start, or its launch's (a wait for room for scratch)."""
EDGE = re.compile(r"^\s*(\[\*\]|\w+)\s*-->\s*(\[\*\]|\w+)\s*(?::\s*(\w+))?\s*$")


def mermaid_blocks(text: str) -> list[str]:
    return re.findall(r"^```mermaid\n(.*?)^```", text, re.S | re.M)


def parse_state_diagram(block: str) -> tuple[dict[tuple[str, str], str], set[str], set[str]]:
    """(edges {(from, to): name}, initial states, final states) of a mermaid stateDiagram; any other line is an
    error, so that a typo cannot hide an edge."""
    lines = [ln for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("%%")]
    assert lines[0].strip() in ("stateDiagram", "stateDiagram-v2"), lines[0]
    edges: dict[tuple[str, str], str] = {}
    initial, final = set(), set()
    for line in lines[1:]:
        m = EDGE.match(line)
        assert m, f"not an edge line: {line!r}"
        src, dst, name = m.groups()
        if src == "[*]":
            initial.add(dst)
        elif dst == "[*]":
            final.add(src)
        else:
            assert (src, dst) not in edges, f"edge {src} -> {dst} written twice"
            edges[(src, dst)] = name
    return edges, initial, final


def the_diagram() -> tuple[dict[tuple[str, str], str], set[str], set[str]]:
    blocks = mermaid_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) == 1, f"expected one mermaid block in {DOC.name}, found {len(blocks)}"
    return parse_state_diagram(blocks[0])


def mermaid_from_table() -> str:
    """The diagram as it should read; the failure message prints it, ready to paste into the doc."""
    lines = ["stateDiagram-v2", *(f"    [*] --> {p.value}" for p in sorted(STARTS, key=lambda p: p.value))]
    lines += [f"    {a.value} --> {b.value}: {name}" for (a, b), name in TRANSITIONS.items()]
    lines += [f"    {p.value} --> [*]" for p in sorted(FINAL_PHASES, key=lambda p: p.value)]
    return "\n".join(lines) + "\n"


def test_the_diagram_is_the_transition_table():
    edges, _, _ = the_diagram()
    table = {(a.value, b.value): name for (a, b), name in TRANSITIONS.items()}
    missing = {e: n for e, n in table.items() if edges.get(e) != n}
    extra = {e: n for e, n in edges.items() if e not in table}
    assert not missing and not extra, f"in states.py, not (or named differently) in the doc: {missing}; " \
                                      f"in the doc, not in states.py: {extra}. The diagram from states.py:\n" \
                                      + mermaid_from_table()


def test_the_generated_diagram_parses_back_to_the_table():
    edges, initial, final = parse_state_diagram(mermaid_from_table())
    assert edges == {(a.value, b.value): name for (a, b), name in TRANSITIONS.items()}
    assert initial == {p.value for p in STARTS} and final == {p.value for p in FINAL_PHASES}


def test_the_diagram_starts_and_ends_where_the_supervisor_does():
    _, initial, final = the_diagram()
    assert initial == {p.value for p in STARTS}
    assert INITIAL_PHASES == {first_phase(pending) for pending in (True, False)}
    assert final == {p.value for p in FINAL_PHASES}


def test_the_phase_table_names_every_phase():
    text = DOC.read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(\w+)` \|", text, re.M))
    assert {p.value for p in Phase} <= rows, f"phases without a row: {sorted({p.value for p in Phase} - rows)}"


def test_the_parser_catches_a_drift():
    good = "stateDiagram-v2\n    [*] --> a\n    a --> b: go\n    b --> [*]\n"
    assert parse_state_diagram(good) == ({("a", "b"): "go"}, {"a"}, {"b"})
    edges, _, _ = parse_state_diagram("stateDiagram-v2\n    waiting_gpu --> staging: gpu_ready\n")
    table = {(a.value, b.value): name for (a, b), name in TRANSITIONS.items()}
    assert edges != table
    try:
        parse_state_diagram("stateDiagram-v2\n    a -> b\n")
    except AssertionError:
        pass
    else:
        raise AssertionError("a malformed edge line was accepted")


def test_daemon_modules_import_without_torch():
    """The doc says daemon/ never imports torch (status speed, supervisor size): import every module with torch
    made unimportable."""
    modules = sorted(p.stem for p in (REPO / "daemon").glob("*.py") if p.stem != "__init__")
    code = ("import sys, importlib; sys.modules['torch'] = None\n"
            f"for m in {modules!r}: importlib.import_module('minilmd.daemon.' + m)\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def section(text: str, heading: str) -> str:
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"no section '## {heading}'"
    return m.group(1)


def test_the_runbook_explains_every_restart_cause():
    rows = set(re.findall(r"^\| `(\w+)` \|", section(RUNBOOK.read_text(encoding="utf-8"), "Restart causes"), re.M))
    assert rows == set(CAUSES), f"missing: {sorted(set(CAUSES) - rows)}; not a cause: {sorted(rows - set(CAUSES))}"


def test_the_runbook_lists_every_exit_status():
    text = section(RUNBOOK.read_text(encoding="utf-8"), "Exit statuses")
    supervisor = {int(s) for s in re.findall(r"^\| (\d+) \|", text, re.M)}
    assert {protocol.SUPERVISOR_DONE, protocol.SUPERVISOR_CONFIG, protocol.SUPERVISOR_GAVE_UP,
            *protocol.FINAL_EXIT_STATUSES} <= supervisor
    trainer = {getattr(protocol, n) for n in dir(protocol) if n.startswith("EXIT_")}
    said = {int(s) for s in re.findall(r"\b(\d+) [a-zA-Z]", text.split("`minilmd train`", 1)[1])}
    assert trainer <= said, f"trainer exit statuses not explained: {sorted(trainer - said)}"


def test_run_help_lists_every_exit_status_of_the_runbook():
    """`minilmd run --help` explains each status the runbook's `minilmd run` table lists (on main it left out 1,
    a crash or a finished run whose last sync failed, which systemd restarts)."""
    table = re.split(r"^`minilmd stop`", section(RUNBOOK.read_text(encoding="utf-8"), "Exit statuses"), flags=re.M)[0]
    listed = {int(s) for s in re.findall(r"^\| (\d+) \|", table, re.M)}
    shown = subprocess.run([sys.executable, "-m", "minilmd.cli", "run", "--help"], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "COLUMNS": "200"}).stdout
    helped = {int(s) for s in re.findall(r"\b(\d+) [a-zA-Z]", shown.split("Exit status:", 1)[1])}
    assert {0, 1, 2} <= listed and listed <= helped, f"not in `minilmd run --help`: {sorted(listed - helped)}\n{shown}"
