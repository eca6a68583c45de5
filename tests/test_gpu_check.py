"""scripts/gpu-check --dry-run: every part of the device check runs on the CPU with a tiny model, so the script
never rots between the runs on a GPU. The table's rows, and part 5 for real: a supervised run SIGKILLed at step 8,
resumed, done, its weights bit-exact against an undisturbed run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check"


@pytest.mark.slow
def test_the_dry_run_runs_every_part_and_part_5_resumes_bit_exact(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--work", str(tmp_path)], capture_output=True,
                          text=True, timeout=600)
    rows = {r["part"]: r for r in json.loads((tmp_path / "summary.json").read_text())}
    assert list(rows) == ["0 corpus", "1 versions", "2 admission", "3 attention", "4 eager", "4 compiled",
                          "4 bench step", "5 run"]
    assert "part           status  seconds  figures" in done.stdout  # the table, printed
    status = {name: r["status"] for name, r in rows.items()}
    assert status["0 corpus"] == status["1 versions"] == status["3 attention"] == status["4 eager"] == "ok", rows
    assert status["2 admission"] == "skip" and rows["2 admission"]["figures"].startswith("no NVML: ")
    assert "on cpu: " in rows["3 attention"]["figures"] and "no SDPA kernel" not in rows["3 attention"]["figures"]
    assert "tok/s" in rows["4 eager"]["figures"] and "checkpoint blocking_s 0." in rows["4 eager"]["figures"]
    assert status["4 compiled"] == "skip"
    bench = rows["4 bench step"]
    assert bench["status"] == "ok", bench
    run = rows["5 run"]
    assert run["status"] == "ok", run
    assert "['killed', 'done']" in run["figures"] and "bit-exact" in run["figures"]
    assert done.returncode == (0 if "fail" not in status.values() else 1)
