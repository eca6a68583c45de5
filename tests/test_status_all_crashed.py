"""`minilmd status --all` of a run whose supervisor crashed after the run ended: state.json says `done` (or
`failed`), but no `outcome` (the supervisor died between the phase and its last words). Before, the row said `done`
as for a clean end, nothing of the crash (`minilmd status RUN` said "did not exit cleanly"); now the phase says
`(killed or crashed)`. A clean end's row is unchanged."""
from __future__ import annotations

import io
import subprocess

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.host import registry
from minilmd.daemon.views import overview
from minilmd.fsio import atomic_write_json


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def _ended_run(tmp_path, name: str, phase: str, outcome: dict | None) -> None:
    run_dir = tmp_path / name
    run_dir.mkdir()
    st = new_state(name, run_dir, str(tmp_path / f"{name}.toml"))
    st["phase"] = phase
    st["supervisor"]["pid"] = _dead_pid()  # gone: crashed, or exited
    if outcome is not None:
        st["outcome"] = outcome
    atomic_write_json(run_dir / names.STATE, st)
    registry.register(name, run_dir, tmp_path / f"{name}.toml")


@pytest.fixture
def own_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "absent"))


def test_a_supervisor_that_crashed_after_its_run_ended_is_said(tmp_path, own_registry):
    _ended_run(tmp_path, "crashed", "done", None)
    _ended_run(tmp_path, "failedcrash", "failed", None)
    _ended_run(tmp_path, "clean", "done", {"exit": 0, "phase": "done", "time": 1.0, "reason": "r",
                                           "ended": "finished"})
    out = io.StringIO()
    overview.status_all(out=out)
    rows = {line.split()[0]: line for line in out.getvalue().splitlines()[1:] if line.strip()}
    assert "done (killed or crashed)" in rows["crashed"], rows
    assert "failed (killed or crashed)" in rows["failedcrash"], rows
    assert "killed or crashed" not in rows["clean"] and " done " in rows["clean"], rows
