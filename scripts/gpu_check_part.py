"""What a part of scripts/gpu-check calls, in the part's own process: the branches it took, `minilmd` commands
echoed into its log, a run config for the part's shapes, a run's metrics, and two runs' final weights compared.
The parts in modules of their own (gpu_check_*.py beside the script) get them as `helpers()`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

BRANCHES: list[str] = []
"""The branches this part's process took ("cuda", "cpu", "fake nvml", ...): its row's "branches"."""


def took(branch: str) -> None:
    BRANCHES.append(branch)


def minilmd(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """A `minilmd` command, its output echoed into this part's log."""
    print("$ minilmd " + " ".join(args), flush=True)
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}, timeout=timeout)
    print(done.stdout[-6000:], flush=True)
    return done


def write_config(work: Path, name: str, p: dict, prepared: str | None = None, **train) -> Path:
    meta = json.loads(Path(prepared or work / "prepared").joinpath("meta.json").read_text())
    model = {**p["model"], "vocab_size": meta["vocab_size"]}
    sections = {
        "run": {"name": name, "dir": str(work / name / "run"), "scratch": str(work / name / "scratch")},
        "data": {"prepared": prepared or str(work / "prepared"), "val_windows": 4},
        "model": model,
        "train": {"seq_len": p["seq_len"], "micro_batch_size": p["micro_batch_size"], "grad_accum": 1, "lr": 1e-3,
                  "warmup_steps": 2, "log_every": 1, "eval_every": 0, "dtype": p["dtype"], "device": p["device"],
                  **train},
        "gpu": {"poll_interval": "1s", "stable_polls": 1},
        "restart": {"backoff_initial": "0.5s", "backoff_max": "2s", "hang_timeout": "5m"},
    }
    text = ""
    for section, values in sections.items():
        text += f"[{section}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()) + "\n"
    shutil.rmtree(work / name, ignore_errors=True)
    path = work / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def read_metrics(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    out = [json.loads(line) for line in lines if line.strip()]
    return [m for m in out if m.get("kind") == kind]


def compare_weights(a_scratch: Path, b_scratch: Path, steps: int, exact: bool) -> tuple[str, bool]:
    """The final checkpoints of both runs: `minilmd verify` each, then the weights: bit for bit when `exact` (the CPU,
    and a GPU with train.deterministic, the default), else within bf16 noise."""
    import numpy as np
    from safetensors.numpy import load_file

    from minilmd import names
    from minilmd.checkpoint_select import find_latest

    finals = []
    for scratch in (a_scratch, b_scratch):
        ckpt = find_latest([scratch / "checkpoints"], log=print)
        if ckpt is None or ckpt.name != names.step_name(steps):
            return f"no final checkpoint of step {steps} under {scratch} (latest: {ckpt})", False
        if minilmd("verify", str(ckpt)).returncode != 0:
            return f"minilmd verify {ckpt.name} failed", False
        finals.append(load_file(str(ckpt / "model.safetensors")))
    a, b = finals
    if a.keys() != b.keys():
        return "different tensors", False
    worst = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)
    same = worst == 0.0 if exact else worst < 1e-2
    return f"weights verified, max |diff| {worst:.3g} vs undisturbed ({'bit-exact' if worst == 0 else 'close'})", same


def helpers() -> SimpleNamespace:
    """What the parts in modules of their own (beside this script) call of it."""
    return SimpleNamespace(minilmd=minilmd, write_config=write_config, compare_weights=compare_weights,
                           read_metrics=read_metrics, took=took)
