"""The run's restart count, one number in every view: `minilmd status RUN`, `status --all`'s RESTARTS column (and its
--json rows) and the Prometheus textfile's minilmd_restarts{cause="all"}. A run stopped cleanly after two restarts
and started again counts anew for restart.max_restarts (state.json: earlier_restarts 2, restarts one since); the run
has restarted 3 times. Before, the overview and the textfile said 1 (this start's), status said 3."""
from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import RunState, new_state
from minilmd.daemon.host import prometheus, registry
from minilmd.daemon.views import overview, status
from minilmd.fsio import atomic_write_json

parser = pytest.importorskip("prometheus_client.parser")


def restarted_run(root: Path) -> Path:
    """A finished run's directory: two restarts before its last clean stop, one in the start after it."""
    run_dir = root / "twice"
    run_dir.mkdir()
    t = time.time()
    st = new_state("twice", run_dir, str(root / "twice.toml"))
    st.update(phase="done", progress={**st["progress"], "step": 100, "total_steps": 100, "loss": 2.5},
              earlier_restarts=2, restarts_since=t - 600,
              restarts=[{"time": t - 300, "attempt": 4, "cause": "sigbus", "exit": -7, "step": 60,
                         "action": "restart"}],
              outcome={"exit": 0, "phase": "done", "time": t - 10, "reason": "the run finished", "ended": "finished"})
    atomic_write_json(run_dir / names.STATE, st)
    return run_dir


def test_status_the_overview_and_the_textfile_give_the_runs_restart_count(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "no-system-registry"))
    run_dir = restarted_run(tmp_path)
    registry.register("twice", run_dir, run_dir.parent / "twice.toml")

    said = io.StringIO()
    assert status.status(run_dir, out=said) == 0
    assert "  restarts: 1 since the start at " in said.getvalue(), said.getvalue()
    assert "(3 since the run began)" in said.getvalue(), said.getvalue()

    shown = io.StringIO()
    assert overview.status_all(out=shown) == 0
    header, row = shown.getvalue().splitlines()[:2]
    cells = dict(zip(header.split(), row.split(), strict=True))
    assert (cells["RUN"], cells["RESTARTS"]) == ("twice", "3"), shown.getvalue()
    rows = io.StringIO()
    assert overview.status_all(as_json=True, out=rows) == 0
    assert [r["restarts"] for r in json.loads(rows.getvalue())] == [3], rows.getvalue()

    prom = tmp_path / "prom" / "twice.prom"
    prom.parent.mkdir()
    state = RunState(run_dir / names.STATE, json.loads((run_dir / names.STATE).read_text()))
    prometheus.Textfile(str(prom), state, lambda *_a, **_k: None).close("done")  # the file a supervisor leaves
    samples = {(s.name, s.labels.get("cause")): s.value
               for family in parser.text_string_to_metric_families(prom.read_text()) for s in family.samples
               if s.name == "minilmd_restarts"}
    assert samples == {("minilmd_restarts", "all"): 3, ("minilmd_restarts", "sigbus"): 1,
                       ("minilmd_restarts", prometheus.EARLIER): 2}, samples
