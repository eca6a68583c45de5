"""What a part of scripts/gpu-check calls, in the part's own process: the branches it took, `minilmd` commands
echoed into its log, a run config for the part's shapes, a run's metrics, and two runs' final weights compared.
The parts in modules of their own (gpu_check_*.py beside the script) get them as `helpers()`."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from minilmd import procs, pychild

BRANCHES: list[str] = []
"""The branches this part's process took ("cuda", "cpu", "fake nvml", ...): its row's "branches"."""
RESULT = "GPU-CHECK-RESULT "
"""The line a part's process ends with: this prefix and a JSON {"status", "figures", "branches"}; a part prints it
also at its milestones with "provisional": true, so that a part killed at its timeout still yields what it measured
(gpu-check reads the last one)."""
END_MARGIN_S = 8.0
"""What a part keeps of its own seconds after its last command: the figures read, the result line printed."""


def took(branch: str) -> None:
    BRANCHES.append(branch)


def result_line(status: str, figures: str, provisional: bool = False) -> str:
    return RESULT + json.dumps({"status": status, "figures": figures, "branches": BRANCHES,
                                **({"provisional": True} if provisional else {})})


def provisional(status: str, figures: str) -> None:
    """What the part has measured so far, as its result should it be killed before its end."""
    print(result_line(status, figures, provisional=True), flush=True)


def time_left() -> float:
    """Seconds this part may still give a command: its timeout's (gpu_check_plan.PartClock) less END_MARGIN_S;
    unbounded outside a part's process, as PartClock is (no MINILMD_GPU_CHECK_PART_S: a test calling a part's
    function)."""
    from gpu_check_plan import PartClock

    return PartClock().left() - END_MARGIN_S


def command_env(env: dict | None) -> dict:
    """This process's environment with `env` over it; a value None removes that variable."""
    out = {**pychild.child_env(), **(env or {})}  # minilmd/pychild.py: PYTHONSAFEPATH=1
    return {k: v for k, v in out.items() if v is not None}


CUT = 124
"""The exit status `minilmd` and `together` give a command cut at the part's time (as timeout(1) does)."""


def minilmd(*args: str, env: dict | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """A `minilmd` command, its output echoed into this part's log; killed when the part's time is up (`timeout`,
    never past `time_left()`), then exit CUT with its output so far: the part still reads what it measured."""
    limit = max(1.0, min(time_left(), timeout if timeout is not None else float("inf")))
    bounded = limit != float("inf")
    print(f"$ minilmd {' '.join(args)}" + (f"    [at most {limit:.0f}s]" if bounded else ""), flush=True)
    try:
        done = pychild.run(pychild.module_argv("minilmd.cli", *args), env=command_env(env), keep_cwd=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=limit if bounded else None)
    except subprocess.TimeoutExpired as e:  # subprocess.run has killed it (a supervisor's trainer: kill_leftovers)
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else (e.output or "")
        done = subprocess.CompletedProcess(e.cmd, CUT, out + f"\n[cut after {limit:.0f}s: the part's time]\n")
    print(done.stdout[-6000:], flush=True)
    return done


def together(commands: list[tuple[str, list[str], dict | None]], slots: int) -> dict[str, int]:
    """Several `minilmd` commands (name, args, env) at once, at most `slots` at a time (runs whose speed is no
    figure: their starts overlap, and an eager step leaves the GPU idle most of its time); each one's output echoed
    when it ends. {name: exit status}."""
    pending, running, codes = list(commands), {}, {}
    while pending or running:
        if time_left() <= 0:  # the part's time is up: what still runs is cut (our own children), the rest not run
            for name, (proc, log) in running.items():
                procs.signal_child(proc.pid, signal.SIGKILL)
                proc.wait()
                log.close()
                codes[name] = CUT
                print(f"--- {name}: cut at the part's time", flush=True)
            codes.update(dict.fromkeys((name for name, _, _ in pending), CUT))
            return codes
        while pending and len(running) < slots:
            name, args, env = pending.pop(0)
            print(f"$ minilmd {' '.join(args)}    [{name}, at once with others]", flush=True)
            log = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
            running[name] = (pychild.popen(pychild.module_argv("minilmd.cli", *args), env=command_env(env),
                                           keep_cwd=True, stdout=log, stderr=subprocess.STDOUT, text=True), log)
        for name, (proc, log) in list(running.items()):
            if proc.poll() is not None:
                log.seek(0)
                print(f"--- {name}: exit {proc.returncode}\n{log.read()[-6000:]}", flush=True)
                log.close()
                codes[name] = proc.returncode
                del running[name]
        time.sleep(0.2)
    return codes


def kill_leftovers(work: Path, since: float) -> list[int]:
    """What a part's supervised runs left running: a supervisor runs in the part's process group (killed with it,
    or by `minilmd` at the part's time), but its trainer in a session of its own (daemon/child/process.py), which
    outlives them and would race the parts after it on the GPU. Each process of the trainer launch that a run under
    WORK recorded (trainer.json) since `since` (wall time: this part's), proven the run's as `minilmd stop` proves
    it (daemon/child/orphans.py: the run directory's owner, its directory and launch id in the environment exec
    gave it, started no earlier than the trainer), SIGTERM then SIGKILL. The pids that were alive."""
    from minilmd import names
    from minilmd.daemon.child.orphans import terminate_orphans

    killed = []
    for record in sorted(work.glob(f"*/run/{names.TRAINER_RECORD}")):
        try:
            if record.stat(follow_symlinks=False).st_mtime < since:
                continue  # an earlier part's run: its trainers ended with it
        except OSError:
            continue
        killed += terminate_orphans(record.parent, grace=0.0)
    return killed


def gpu_slots(per_run_gib: float = 30.0, most: int = 4) -> int:
    """How many runs of part 4's shape share the GPU at once: its free memory (nvidia-smi) over a run's peak (28.3
    GiB eager, measured), 8 GiB kept free: 4 on an H200, 2 on an 80 GB H100; `most` without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return most
    done = procs.run_bounded([smi, "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"], 30,
                             text=True)
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


def recorded_kernels(scratch: Path) -> dict:
    """What a run recorded of its kernels in its newest checkpoint (trainer_state "kernels": the attention backend,
    how it was chosen, each backend's time); {} without one."""
    from minilmd import names
    from minilmd.checkpoint_select import find_latest

    ckpt = find_latest([scratch / "checkpoints"], log=print)
    if ckpt is None:
        return {}
    kernels = json.loads((ckpt / names.TRAINER_STATE).read_text(encoding="utf-8")).get("kernels")
    return kernels if isinstance(kernels, dict) else {}


def recorded_attention(scratch: Path) -> str:
    """The attention kernel a run recorded in its newest checkpoint, as model.attention forces it: another run
    compared bit for bit with it (or bench step, timed against it) must run the same kernel ("auto" for torch's
    own, the CPU's)."""
    chosen = recorded_kernels(scratch).get("attention")
    return chosen if chosen in ("flash", "efficient", "cudnn", "math") else "auto"


def attention_words(scratch: Path) -> str:
    """The attention kernel a run chose, how, and each backend's time: "attention flash (measured: flash 3.870 ms,
    efficient 4.100 ms, math 6.500 ms)"; issue 41's kernel chosen by measurement, shown in part 4's row."""
    k = recorded_kernels(scratch)
    if not k:
        return "attention: no checkpoint"
    times = ", ".join(f"{n} {'-' if ms is None else f'{ms:.3f} ms'}" for n, ms in (k.get("attention_ms") or {}).items())
    return f"attention {k.get('attention')} ({k.get('attention_how')}{': ' + times if times else ''})"


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
                           verify_at_once=verify_at_once, recorded_attention=recorded_attention, median=median,
                           provisional=provisional, time_left=time_left, kill_leftovers=kill_leftovers)
