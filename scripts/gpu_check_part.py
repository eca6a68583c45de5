"""What a part of scripts/gpu-check calls, in the part's own process: the branches it took, `minilmd` commands
echoed into its log, a run config for the part's shapes, a run's metrics, and two runs' final weights compared.
The parts in modules of their own (gpu_check_*.py beside the script) get them as `helpers()`."""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from minilmd import pychild

BRANCHES: list[str] = []
"""The branches this part's process took ("cuda", "cpu", "fake nvml", ...): its row's "branches"."""


def took(branch: str) -> None:
    BRANCHES.append(branch)


def command_env(env: dict | None) -> dict:
    """This process's environment with `env` over it; a value None removes that variable."""
    out = {**pychild.child_env(), **(env or {})}  # minilmd/pychild.py: PYTHONSAFEPATH=1
    return {k: v for k, v in out.items() if v is not None}


def minilmd(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """A `minilmd` command, its output echoed into this part's log."""
    print("$ minilmd " + " ".join(args), flush=True)
    done = subprocess.run(pychild.module_argv("minilmd.cli", *args), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=command_env(env), timeout=timeout)
    print(done.stdout[-6000:], flush=True)
    return done


def together(commands: list[tuple[str, list[str], dict | None]], slots: int) -> dict[str, int]:
    """Several `minilmd` commands (name, args, env) at once, at most `slots` at a time (runs whose speed is no
    figure: their starts overlap, and an eager step leaves the GPU idle most of its time); each one's output echoed
    when it ends. {name: exit status}."""
    pending, running, codes = list(commands), {}, {}
    while pending or running:
        while pending and len(running) < slots:
            name, args, env = pending.pop(0)
            print(f"$ minilmd {' '.join(args)}    [{name}, at once with others]", flush=True)
            log = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
            running[name] = (subprocess.Popen(pychild.module_argv("minilmd.cli", *args), stdout=log,
                                              stderr=subprocess.STDOUT, text=True, env=command_env(env)), log)
        for name, (proc, log) in list(running.items()):
            if proc.poll() is not None:
                log.seek(0)
                print(f"--- {name}: exit {proc.returncode}\n{log.read()[-6000:]}", flush=True)
                log.close()
                codes[name] = proc.returncode
                del running[name]
        time.sleep(0.2)
    return codes


def gpu_slots(per_run_gib: float = 30.0, most: int = 4) -> int:
    """How many runs of part 4's shape share the GPU at once: its free memory (nvidia-smi) over a run's peak (28.3
    GiB eager, measured), 8 GiB kept free: 4 on an H200, 2 on an 80 GB H100; `most` without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return most
    done = subprocess.run([smi, "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"],
                          capture_output=True, text=True, timeout=30)
    try:
        free_gib = float(done.stdout.split()[0]) / 1024
    except (IndexError, ValueError):
        return 1
    return max(1, min(most, int((free_gib - 8) // per_run_gib)))


def write_config(work: Path, name: str, p: dict, prepared: str | None = None, attention: str | None = None,
                 **train) -> Path:
    """The run config of part `name` (its folder WORK/name removed first); `attention` forces model.attention."""
    meta = json.loads(Path(prepared or work / "prepared").joinpath("meta.json").read_text())
    model = {**p["model"], "vocab_size": meta["vocab_size"], **({"attention": attention} if attention else {})}
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


VERIFIED: set[Path] = set()
"""Checkpoints `minilmd verify` passed in this part's process (`verify_at_once`): not verified again."""


def verify_at_once(ckpts: list[Path]) -> None:
    """`minilmd verify` of each checkpoint, at once (a torch-free command: its start and hashing on the CPU)."""
    todo = [c for c in ckpts if c.is_dir() and c not in VERIFIED]
    codes = together([(str(c), ["verify", str(c)], None) for c in todo], slots=len(todo) or 1)
    VERIFIED.update(c for c in todo if codes.get(str(c)) == 0)


def compare_weights(a_scratch: Path, b_scratch: Path, steps: int, exact: bool) -> tuple[str, bool]:
    """The final checkpoints of both runs: `minilmd verify` each (unless done), then the weights: bit for bit when
    `exact` (the CPU, and a GPU with train.deterministic, the default), else within bf16 noise."""
    import numpy as np
    from safetensors.numpy import load_file

    from minilmd import names
    from minilmd.checkpoint_select import find_latest

    finals = []
    for scratch in (a_scratch, b_scratch):
        ckpt = find_latest([scratch / "checkpoints"], log=print)
        if ckpt is None or ckpt.name != names.step_name(steps):
            return f"no final checkpoint of step {steps} under {scratch} (latest: {ckpt})", False
        if ckpt not in VERIFIED and minilmd("verify", str(ckpt)).returncode != 0:
            return f"minilmd verify {ckpt.name} failed", False
        VERIFIED.add(ckpt)
        finals.append(load_file(str(ckpt / "model.safetensors")))
    a, b = finals
    if a.keys() != b.keys():
        return "different tensors", False
    worst = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)
    same = worst == 0.0 if exact else worst < 1e-2
    return f"weights verified, max |diff| {worst:.3g} vs undisturbed ({'bit-exact' if worst == 0 else 'close'})", same


def recorded_attention(scratch: Path) -> str:
    """The attention kernel a run recorded in its newest checkpoint (trainer_state "kernels"), as model.attention
    forces it: another run compared bit for bit with it must run the same kernel ("auto" for torch's own, the
    CPU's)."""
    from minilmd import names
    from minilmd.checkpoint_select import find_latest

    ckpt = find_latest([scratch / "checkpoints"], log=print)
    if ckpt is None:
        return "auto"
    kernels = json.loads((ckpt / names.TRAINER_STATE).read_text(encoding="utf-8")).get("kernels") or {}
    chosen = kernels.get("attention")
    return chosen if chosen in ("flash", "efficient", "cudnn", "math") else "auto"


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return float("nan")
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def helpers() -> SimpleNamespace:
    """What the parts in modules of their own (beside this script) call of it."""
    return SimpleNamespace(minilmd=minilmd, write_config=write_config, compare_weights=compare_weights,
                           read_metrics=read_metrics, took=took, together=together, gpu_slots=gpu_slots,
                           verify_at_once=verify_at_once, recorded_attention=recorded_attention, median=median)
