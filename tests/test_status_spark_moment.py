"""`minilmd status`'s step line and its loss sparkline tell the run at one moment. The step line is state.json's
(the supervisor writes it every few seconds); the sparkline read metrics.jsonl itself, so between two writes it ran
ahead: `step 5/10 loss 4.5000` over `loss ... steps 1-10: 5.0000 -> 4.0000`. Now the sparkline ends at the step
line's step."""
from __future__ import annotations

import io
import json

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.views.status import status
from minilmd.fsio import atomic_write_json


def test_the_sparkline_ends_at_the_step_the_step_line_shows(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    st = new_state("r", run_dir, str(tmp_path / "r.toml"))  # its supervisor: this process, alive
    st["phase"] = "training"
    st["progress"] = {"step": 5, "total_steps": 10, "loss": 4.5}
    atomic_write_json(run_dir / names.STATE, st)
    (run_dir / names.METRICS).write_text("".join(json.dumps(
        {"kind": "train", "step": s, "tokens_seen": s * 128, "loss": 5.0 - s / 10, "lr": 1e-3, "grad_norm": 1.0,
         "tok_s": 500.0, "time": 1000.0 + s}) + "\n" for s in range(1, 11)))  # logged since: steps 6-10
    out = io.StringIO()
    status(run_dir, out=out)
    lines = out.getvalue().splitlines()
    assert any(line.startswith("  step 5/10") for line in lines), lines
    [spark] = [line for line in lines if line.startswith("  loss ")]
    assert "steps 1-5: 4.9000 -> 4.5000" in spark, spark
