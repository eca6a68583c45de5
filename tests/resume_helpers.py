"""Helpers for the tests that kill `minilmd train` and resume it (test_resume, test_sft_run, test_docmask_run): the
command as a real process (started, or run to its end) where something kills it, in the test's own process where
nothing does, the step its heartbeat last said, and every training loss its metrics logged, by step."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from minilmd import checkpoint as ck
from minilmd.names import FAULT_ENV, HEARTBEAT, METRICS


def env_with(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, ck.KILL_ENV)}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def start(config: Path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "minilmd.cli", "train", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_with(**env))


def attempt(config: Path, **env) -> tuple[int, str]:
    proc = start(config, **env)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def attempt_here(config: Path, *sets: str) -> tuple[int, str]:
    """attempt()'s (exit status, output) for a run that nothing kills (a resume to its end, a refusal), run in the
    test's own process (in_process.py): without a new Python's imports, about 3 CPU-s a run on the CI's 2 cores."""
    from in_process import train_in_process  # torch: only for the tests that train

    done = train_in_process(config, *sets)
    return done.returncode, done.stdout + done.stderr


def heartbeat_step(run_dir: Path) -> int:
    try:
        return int((run_dir / HEARTBEAT).read_text().strip().split("/")[0] or -1)  # "STEP/TOTAL"
    except (FileNotFoundError, ValueError):
        return -1


def losses_by_step(run_dir: Path) -> dict[int, set[float]]:
    seen: dict[int, set[float]] = {}
    for line in (run_dir / METRICS).read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "train":
            seen.setdefault(rec["step"], set()).add(rec["loss"])
    return seen
