"""What `minilmd status` and the supervisor load: neither needs numpy, torch or the corpus tooling's libraries, so
neither may import them (status answers at once; the supervisor stays small beside the trainer for days).

Each check runs the real command in a fresh interpreter and reads its `sys.modules` afterwards: module sets, never
times or memory. The supervisor's set is taken at its first tick, before staging (whose thread reads the corpus
with numpy, fsspec and tokenizers, as it must).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.fsio import atomic_write_json
from supervisor_helpers import env_for, write_config

HEAVY = {"numpy", "torch", "fsspec", "jinja2", "tokenizers", "safetensors", "pydantic"}
"""What neither `minilmd status` nor the supervisor up to its first tick may import."""

STATUS_MODULES = """
import json, runpy, sys
sys.argv = ["minilmd", "status", sys.argv[1]]
try:
    runpy.run_module("minilmd.cli", run_name="__main__")
except SystemExit:
    pass
open(OUT, "w").write(json.dumps(sorted(sys.modules)))
"""

SUPERVISOR_MODULES = """
import json, os, runpy, signal, sys
from minilmd.daemon import supervisor

first_tick = supervisor.Supervisor._tick

def tick(self):
    if not os.path.exists(OUT):  # the first tick: what the launch path has loaded so far
        open(OUT, "w").write(json.dumps(sorted(sys.modules)))
        os.kill(os.getpid(), signal.SIGTERM)  # then a stop: the run ends before it stages
    first_tick(self)

supervisor.Supervisor._tick = tick
sys.argv = ["minilmd", "run", sys.argv[1]]
runpy.run_module("minilmd.cli", run_name="__main__")
"""


def modules_of(script: str, arg: Path, out: Path) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", f"OUT = {str(out)!r}\n" + script, str(arg)], capture_output=True,
                          text=True, timeout=120, env=env_for())
    assert out.is_file(), proc.stdout + proc.stderr
    return set(json.loads(out.read_text()))


def test_status_of_a_run_imports_no_numpy_torch_or_corpus_libraries(tmp_path, corpus):
    config = write_config(tmp_path, corpus, name="r")
    run_dir = tmp_path / "r" / "run"
    (run_dir / names.ATTEMPT_LOGS).mkdir(parents=True)
    (run_dir / names.RUN_CONFIG_COPY).write_text(config.read_text())  # status reads it for the lineage
    state = new_state("r", run_dir, str(config))
    t = time.time()
    state.update(phase="training", since=t - 60, progress={**state["progress"], "step": 12, "total_steps": 30,
                                                            "loss": 3.2, "heartbeat": t})
    atomic_write_json(run_dir / names.STATE, state)
    (run_dir / names.METRICS).write_text(json.dumps({"kind": "train", "step": 12, "loss": 3.2, "time": t}) + "\n")
    loaded = modules_of(STATUS_MODULES, run_dir, tmp_path / "modules.json")
    assert "minilmd.daemon.views.status" in loaded  # it did show the status
    assert not loaded & HEAVY, sorted(loaded & HEAVY)
    assert not any(m.startswith("minilmd.trainer") for m in loaded)


def test_the_supervisor_imports_no_numpy_torch_or_corpus_libraries_before_staging(tmp_path, corpus):
    config = write_config(tmp_path, corpus, name="s", remote=False)
    loaded = modules_of(SUPERVISOR_MODULES, config, tmp_path / "modules.json")
    assert {"minilmd.daemon.supervisor", "minilmd.daemon.preflight", "minilmd.daemon.runfiles"} <= loaded
    assert not loaded & HEAVY, sorted(loaded & HEAVY)
    assert not any(m.startswith("minilmd.trainer") for m in loaded)
    state = json.loads((tmp_path / "s" / "run" / names.STATE).read_text())
    assert state["phase"] == "done" and state["outcome"]["exit"] == 0  # the run it watched was a real one
