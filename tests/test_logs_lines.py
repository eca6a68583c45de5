"""`minilmd logs -n N`: N lines of each log, the supervisor's and the current attempt's, through the real CLI."""
from __future__ import annotations

import subprocess
import sys

from minilmd.daemon.base.runstate import new_state
from minilmd.fsio import atomic_write_json


def test_logs_n_prints_n_lines_of_each_log(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    atomic_write_json(run_dir / "state.json", new_state("demo", run_dir, str(tmp_path / "demo.toml")))
    (run_dir / "supervisor.log").write_text("".join(f"supervisor {i}\n" for i in range(10)))
    (run_dir / "logs" / "attempt-0001.log").write_text("".join(f"trainer {i}\n" for i in range(10)))
    out = subprocess.run([sys.executable, "-m", "minilmd.cli", "logs", str(run_dir), "-n", "3"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    body = [line for line in out.stdout.splitlines() if not line.startswith("==> ")]
    assert body == ["supervisor 7", "supervisor 8", "supervisor 9", "trainer 7", "trainer 8", "trainer 9"]
