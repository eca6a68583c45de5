"""State names by member: the states state.json records (minilmd/run_states.py: Phase, SyncState, StagingState) are
compared as their enums' members everywhere else, never as a string written again. A renamed value (or a typo:
"waiting_remote" for "waiting-remote") made such a comparison silently false: house9 item 7 found ~35 of them in
status, the overview, statesections, the Prometheus textfile and the core's readers of a run's end, which could not
reach the enums then (they lived in daemon/base/states.py).

The audit, over the code and the scripts (source_tree.audited_files), flags a comparison (==, !=, in, not in, is)
one of whose sides is a string literal (or a tuple, list or set of them) equal to one of those enums' values, outside
minilmd/run_states.py. Another vocabulary that shares a word ("failed", "done", "running") is listed in REVIEWED, the
comparison as written, with why.
"""
from __future__ import annotations

import ast
from pathlib import Path

import source_tree
from minilmd.run_states import Phase, StagingState, SyncState

THE_MODULE = "minilmd/run_states.py"
STATE_VALUES = frozenset(member.value for enum in (Phase, SyncState, StagingState) for member in enum)

REVIEWED: dict[str, str] = {
    "daemon/jobs/resumefrom.py:outcome == 'failed'": "scratch_behind.peek's outcome (refused, failed, found)",
    "daemon/jobs/scratch_behind.py:peeked[0] == 'failed'": "peek's outcome, its first item",
    "daemon/jobs/stagingworker.py:worker.name == 'staging'": "the name of the worker thread stagingworker starts",
    "daemon/phases/initwait.py:predecessor_outcome(pred)[0] != 'done'": "init_source's PredecessorReport.outcome "
                                                                         "(done, failed, waiting), not a phase",
    "daemon/phases/initwait.py:report.outcome == 'done'": "init_source's PredecessorReport.outcome",
    "minilmd/init_moved.py:report.outcome == 'done'": "init_source's PredecessorReport.outcome",
    "daemon/phases/initwait.py:report.outcome == 'failed'": "init_source's PredecessorReport.outcome",
    "minilmd/leftovers.py:outcome == 'running'": "leftovers.clear's outcome (its maker still running)",
    "minilmd/init_source.py:report.outcome != 'done'": "its own PredecessorReport.outcome, not a phase",
    "scripts/gpu_check_determinism.py:status != 'ok'": "a device check part's status (ok, fail, skip)",
    "scripts/gpu_check_sidebyside.py:status == 'ok'": "a device check part's status (ok, fail, skip)",
}
"""file:comparison (as ast.unparse writes it) of a word that is another vocabulary's, or left with why."""


def _state_literal(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_state_literal(item) for item in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in STATE_VALUES


def state_literals(module: ast.Module) -> list[tuple[int, str]]:
    """(line, the comparison as written) of each comparison with a state's value spelled as a string."""
    return sorted((node.lineno, ast.unparse(node)) for node in ast.walk(module)
                  if isinstance(node, ast.Compare) and any(_state_literal(side)
                                                           for side in (node.left, *node.comparators)))


def test_no_state_is_compared_as_a_string_outside_its_enum():
    found = {f"{source_tree.relative(path)}:{code}": line
             for path in source_tree.audited_files() if source_tree.relative(path) != THE_MODULE
             for line, code in state_literals(source_tree.tree(path))}
    unreviewed = sorted(f"{where} (line {line})" for where, line in found.items() if where not in REVIEWED)
    assert not unreviewed, "compare with minilmd.run_states' members (Phase.DONE, SyncState.OFF, ...):\n" + \
        "\n".join(unreviewed)
    assert set(REVIEWED) <= set(found), f"reviewed but gone (drop them): {sorted(set(REVIEWED) - set(found))}"


def test_the_audit_sees_each_spelling(tmp_path: Path):
    module = tmp_path / "m.py"
    module.write_text("from minilmd.run_states import Phase, SyncState\n"
                      "def f(state, sync, r):\n"
                      "    a = state.get('phase') != 'done'\n"                       # 3
                      "    b = sync.state in ('failed', 'stalled')\n"                # 4
                      "    c = 'waiting_gpu' == r\n"                                 # 5
                      "    d = r in {'off', 'x'}\n"                                  # 6
                      "    e = state.get('phase') == Phase.DONE\n"                   # 7: a member
                      "    g = sync.state in (SyncState.FAILED,)\n"                  # 8: members
                      "    h = r == 'finished'\n"                                    # 9: not a state's value
                      "    i = {'phase': 'done'}\n"                                  # 10: written, not compared
                      "    return a, b, c, d, e, g, h, i\n")
    assert [line for line, _ in state_literals(source_tree.tree(module))] == [3, 4, 5, 6]
