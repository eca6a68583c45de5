"""procs.scope_or_none tells a link on a run directory's path to that run's event writer alone (tell_links_to, by
run directory). Before, one writer per process was kept until its supervisor's files were closed: a supervisor in
a test process that never closed them left a writer whose log was closed, and the next test's check of another run
ended in that writer's AssertionError instead of None (two tests of test_run_arg_owners.py failed so, in turn, in
the full suite)."""
from __future__ import annotations

from minilmd import procs


def _run_behind_a_link(root, name):
    real = root / f"{name}-real"
    (real / "run").mkdir(parents=True)
    (root / name).symlink_to(real)
    return root / name / "run"


def test_a_writer_left_by_one_run_is_never_handed_another_runs_link(tmp_path, capsys):
    told: list[str] = []

    def closed_writer(said: str) -> None:
        raise AssertionError("the log of a run whose supervisor is gone")

    left, checked = _run_behind_a_link(tmp_path, "left"), _run_behind_a_link(tmp_path, "checked")
    procs.tell_links_to(left, closed_writer)
    procs.tell_links_to(checked, told.append)
    try:
        assert procs.scope_or_none(checked) is None  # the link said, nothing proven, no exception
        assert len(told) == 1 and "symbolic link on the way" in told[0], told
        assert "symbolic link on the way" in capsys.readouterr().err
    finally:
        procs.tell_links_to(left, None)
        procs.tell_links_to(checked, None)
    assert procs.scope_or_none(_run_behind_a_link(tmp_path, "after")) is None and told == [told[0]]
