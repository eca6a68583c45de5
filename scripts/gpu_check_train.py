"""scripts/gpu-check parts 4 (`minilmd train` eager and compiled, `bench step`), 5 run (a supervised run killed and
resumed, compared bit for bit with an undisturbed one, and the restart time) and 7 oom (exit 76 and fault.json)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from gpu_check_part import compare_weights, minilmd, read_metrics, took, write_config


def part_train(compiled: bool):
    def part(work: Path, p: dict, dry: bool) -> tuple[str, str]:
        if not (work / "prepared" / "meta.json").exists():
            return "fail", "no corpus (part 0 failed)"
        name = "compiled" if compiled else "eager"
        took(name)
        env = {"TORCH_LOGS": "graph_breaks,recompiles"}
        if compiled and dry:
            # No inductor on the CPU (a cold compile of the tiny model took 65 s on 2 cores): torch.compile returns
            # the model itself, and the trainer still runs its compile path (the compiling step, compile_s).
            env["TORCHDYNAMO_DISABLE"] = "1"
            took("compile disabled")
        steps = p["warm_steps"] + p["timed_steps"]
        config = write_config(work, name, p, compile=compiled, max_steps=steps,
                              checkpoint_every=p["warm_steps"] + p["timed_steps"] // 2)
        started = time.monotonic()
        done = minilmd("train", str(config), env=env)
        wall = time.monotonic() - started
        if done.returncode != 0:
            return "fail", f"minilmd train: exit {done.returncode}"
        run_dir = work / name / "run"
        lines = read_metrics(run_dir, "train")
        timed = [m for m in lines if m["step"] > p["warm_steps"]]
        saves = read_metrics(run_dir, "checkpoint")
        med = sorted(m["tok_s"] for m in timed)[len(timed) // 2]
        figures = [f"{len(timed)} timed steps", f"{med:,.0f} tok/s"]
        mfu = sorted(m["mfu"] for m in timed if m.get("mfu") is not None)
        figures.append(f"MFU {100 * mfu[len(mfu) // 2]:.1f}%" if mfu and mfu[-1] <= 1 else
                       f"MFU {mfu[len(mfu) // 2]:.1f}" if mfu else "MFU n/a")
        peak = max((m.get("peak_mem_gib") or 0 for m in timed), default=0)
        figures.append(f"peak {peak:.1f} GiB" if peak else "peak memory n/a")
        figures.append("checkpoint blocking_s " + (", ".join(f"{s['blocking_s']:.3f}" for s in saves) or "none"))
        figures.append(f"compile_s {sum(m.get('compile_s', 0) for m in lines):.2f}")
        text = done.stdout
        figures.append(f"graph breaks {text.count('Graph break')}, recompiles {text.count('Recompiling')}")
        figures.append(f"wall {wall:.0f}s")
        return ("ok" if len(timed) >= p["timed_steps"] and saves else "fail"), ", ".join(figures)
    return part


def part_bench_step(work: Path, p: dict, dry: bool) -> tuple[str, str]:
    probe = minilmd("bench", "step", "--help")
    if probe.returncode != 0:
        return "fail", "command missing: this minilmd has no `bench step`"
    if not (work / "prepared" / "meta.json").exists():
        return "fail", "no corpus (part 0 failed)"
    config = write_config(work, "bench-step", p, compile=False, max_steps=20)
    # on the CPU the eager backend only traces: a cold inductor compile of even the tiny model takes minutes there
    took("backend eager" if dry else "backend inductor")
    args = ["bench", "step", "--config", str(config), "--steps", "3" if dry else "20"]
    done = minilmd(*args, *(["--backend", "eager"] if dry else []))
    lines = [" ".join(ln.split()) for ln in done.stdout.splitlines()
             if ln.startswith(("eager", "compiled", "loss in the model", "masked/unmasked"))]  # 6 modes, 3 ratios
    return ("ok" if done.returncode == 0 else "fail"), (" | ".join(lines) or f"exit {done.returncode}")[:1000]


def part_run(work: Path, p: dict, dry: bool) -> tuple[str, str]:
    if not (work / "prepared" / "meta.json").exists():
        return "fail", "no corpus (part 0 failed)"
    took("supervised run")
    steps = p["run_steps"]
    supervised = write_config(work, "supervised", p, max_steps=steps, checkpoint_every=4, compile=False)
    plain = write_config(work, "undisturbed", p, max_steps=steps, checkpoint_every=4, compile=False)
    run = minilmd("run", str(supervised), env={"MINILMD_FAULT": "sigkill@8"})
    ref = minilmd("train", str(plain))
    events = [json.loads(line) for line in (work / "supervised" / "run" / "events.jsonl").read_text().splitlines()]
    exits = [e.get("cause") for e in events if e.get("event") == "child_exit"]
    admitted = next((e["message"] for e in events if e.get("transition") and e.get("new") == "staging"), "")
    figures = [f"admitted: {admitted[:120]}", f"trainer ends: {exits}", f"run exit {run.returncode}"]
    killed = len(exits) >= 2 and exits[0] in ("killed", "oom_kill") and exits[-1] == "done"
    if run.returncode != 0 or ref.returncode != 0 or not killed:
        return "fail", "; ".join(figures + [f"undisturbed train exit {ref.returncode}"])
    verdict, same = compare_weights(work / "supervised" / "scratch", work / "undisturbed" / "scratch", steps, True)
    figures += [verdict, restart_time(work / "supervised" / "run")]
    return ("ok" if same else "fail"), "; ".join(figures)


def restart_time(run_dir: Path) -> str:
    """From the trainer's death (the supervisor's child_exit event) to the first optimizer step the next attempt
    logged (log_every = 1): backoff, the new process, imports, the resume, the first step (and its compile, when
    compiled)."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    died = next((e["time"] for e in events if e.get("event") == "child_exit"), None)
    after = [m["time"] for m in read_metrics(run_dir, "train") if died is not None and m["time"] > died]
    if died is None or not after:
        return "restart time: not measured (no death or no step after it)"
    return f"restart: {after[0] - died:.1f}s from the kill to the first new optimizer step"


def part_oom(work: Path, p: dict, dry: bool) -> tuple[str, str]:
    """A CUDA out-of-memory as the trainer meets it: exit 76 (protocol.EXIT_CUDA_OOM), and fault.json's text, which
    `minilmd status` shows. On a GPU a micro-batch no card holds; in the dry run the trainer's injected OOM
    (MINILMD_FAULT=oom@2, torch.OutOfMemoryError through the same handler): a CPU has no CUDA memory to exhaust."""
    from minilmd import protocol

    if not (work / "prepared" / "meta.json").exists():
        return "fail", "no corpus (part 0 failed)"
    took("injected oom" if dry else "real oom")
    # 2048 x 8 (its weights and AdamW state 6.4 GB) at 1024 x 1024 tokens a step: ~0.5 TB of activations, so the
    # forward runs out, the common case. A million tokens a step should be under part 0's corpus (~1.5M train
    # tokens by estimate, not measured on a GPU yet): an exit 65 here means halve the micro-batch.
    big = p if dry else {**p, "micro_batch_size": 1024, "model": {"hidden_size": 2048, "num_hidden_layers": 8,
                                                                   "num_attention_heads": 16, "num_key_value_heads": 8}}
    config = write_config(work, "oom", big, compile=False, max_steps=4, checkpoint_every=100)
    done = minilmd("train", str(config), env={"MINILMD_FAULT": "oom@2"} if dry else None)
    fault = protocol.read_fault(work / "oom" / "run") or {}
    figures = f"exit {done.returncode}; fault.json {json.dumps(fault)[:400]}"
    return ("ok" if done.returncode == protocol.EXIT_CUDA_OOM and fault.get("kind") == "cuda_oom" else "fail"), figures
