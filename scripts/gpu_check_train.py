"""scripts/gpu-check parts 4 (`minilmd train` eager and compiled, `bench step`), 5 run (part 4 compiled's run carried
on under `minilmd run`, killed and restarted: the restart time with the run's own compile cache) and 7 oom (exit 76
and fault.json)."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from gpu_check_part import (
    attention_words,
    kill_leftovers,
    median,
    minilmd,
    read_metrics,
    recorded_attention,
    took,
    write_config,
)
from gpu_check_plan import OPTIONAL_S, PartClock

from minilmd.daemon.base.states import Cause
from minilmd.daemon.child.compilecache import CACHE_DIRS
from minilmd.run_states import Phase


def train_config(work: Path, name: str, p: dict, compiled: bool, **train) -> Path:
    """Part 4's run config (eager or compiled), which part 5's runs repeat: warm-up and timed steps at the GPU's
    log_every (a metrics line every 10 steps, as the loop runs by default), a checkpoint in the middle and at the end,
    a constant rate past the warm-up (min_lr_ratio 1: part 5 run carries the compiled run on past its end, and an
    undisturbed run of the longer length then has the same rates)."""
    steps = p["warm_steps"] + p["timed_steps"]
    values = {"compile": compiled, "max_steps": steps, "checkpoint_every": p["warm_steps"] + p["timed_steps"] // 2,
              "min_lr_ratio": 1.0, "log_every": p["log_every"], **train}
    return write_config(work, name, p, **values)


def part_train(compiled: bool, second: bool = False):
    """Part 4's `minilmd train` (eager or compiled); `second`: at p["second_shape"] (its layers and seq_len: the
    reference notes' 768 x 16 at T=768 on the GPU), in a run of its own, figures prefixed with the shape."""
    def part(work: Path, p: dict, dry: bool) -> tuple[str, str]:
        if not (work / "prepared" / "meta.json").exists():
            return "fail", "no corpus (part 0 failed)"
        name = ("compiled" if compiled else "eager") + ("-second-shape" if second else "")
        took(name)
        if second:
            shape = p["second_shape"]
            p = {**p, "model": {**p["model"], "num_hidden_layers": shape["num_hidden_layers"]},
                 "seq_len": shape["seq_len"]}
        env = {"TORCH_LOGS": "graph_breaks,recompiles"}
        if compiled and dry:
            # No inductor on the CPU (a cold compile of the tiny model took 65 s on 2 cores): torch.compile returns
            # the model itself, and the trainer still runs its compile path (the compiling step, compile_s).
            env["TORCHDYNAMO_DISABLE"] = "1"
            took("compile disabled")
        config = train_config(work, name, p, compiled)
        started = time.monotonic()
        done = minilmd("train", str(config), env=env)
        wall = time.monotonic() - started
        run_dir = work / name / "run"
        if done.returncode != 0 and not (run_dir / "metrics.jsonl").exists():
            return "fail", f"minilmd train: exit {done.returncode}"
        lines = read_metrics(run_dir, "train")
        timed = [m for m in lines if m["step"] > p["warm_steps"]]
        saves = read_metrics(run_dir, "checkpoint")
        timed_steps = timed[-1]["step"] - p["warm_steps"] if timed else 0
        model = p["model"]
        figures = [f"{model['hidden_size']} x {model['num_hidden_layers']} at T={p['seq_len']}"] if second else []
        figures += [f"{timed_steps} timed steps ({len(timed)} metrics lines, log_every {p['log_every']})",
                   f"{median([m['tok_s'] for m in timed]):,.0f} tok/s"]
        mfu = [m["mfu"] for m in timed if m.get("mfu") is not None]
        figures.append(f"MFU {100 * median(mfu):.1f}%" if mfu and max(mfu) <= 1 else
                       f"MFU {median(mfu):.1f}" if mfu else "MFU n/a")
        peak = max((m.get("peak_mem_gib") or 0 for m in timed), default=0)
        figures.append(f"peak {peak:.1f} GiB" if peak else "peak memory n/a")
        figures.append("checkpoint blocking_s " + (", ".join(f"{s['blocking_s']:.3f}" for s in saves) or "none"))
        figures.append(f"compile_s {sum(m.get('compile_s', 0) for m in lines):.2f}")
        text = done.stdout
        figures.append(f"graph breaks {text.count('Graph break')}, recompiles {text.count('Recompiling')}")
        figures.append(attention_words(work / name / "scratch"))
        figures.append(f"wall {wall:.0f}s")
        if done.returncode != 0:  # cut at the part's time, or failed: what it measured before, the row fail
            figures.insert(0, f"exit {done.returncode} after")
        ok = done.returncode == 0 and timed_steps >= p["timed_steps"] and saves
        return ("ok" if ok else "fail"), ", ".join(figures)
    return part


def part_bench_step(work: Path, p: dict, dry: bool) -> tuple[str, str]:
    """`minilmd bench step` on part 4's model and batch, with the kernels part 4 compiled's run chose (its recorded
    attention backend forced; train.deterministic as the run's, the default): the loop's yardstick. Its row: each
    mode's line, and the loop / bench ratio of tok/s (part 4's median over its timed steps), issue 41's "within 3 %"."""
    probe = minilmd("bench", "step", "--help")
    if probe.returncode != 0:
        return "fail", "command missing: this minilmd has no `bench step`"
    if not (work / "prepared" / "meta.json").exists():
        return "fail", "no corpus (part 0 failed)"
    config = write_config(work, "bench-step", p, compile=False, max_steps=20)
    # on the CPU the eager backend only traces: a cold inductor compile of even the tiny model takes minutes there
    took("backend eager" if dry else "backend inductor")
    # the trainer's step eager and compiled (the loop's yardstick, issue 41); the loss-outside and doc-mask modes
    # (measured on issue 41's lease) only when this part's share has room for their two compiles
    clock = PartClock()
    modes = "" if clock.fits("the loss-outside and doc-mask modes", OPTIONAL_S["bench step's other modes"] + 30) \
        else "eager,compiled"
    kernel = recorded_attention(work / "compiled" / "scratch")
    args = ["bench", "step", "--config", str(config), "--steps", str(p["bench_steps"]),
            "--set", f"model.attention={json.dumps(kernel)}"]
    done = minilmd(*args, *(["--modes", modes] if modes else []), *(["--backend", "eager"] if dry else []))
    lines = [" ".join(ln.split()) for ln in done.stdout.splitlines()
             if ln.startswith(("eager", "compiled", "loss in the model", "masked/unmasked", "kernels"))]
    figures = f"{p['bench_steps']} timed steps a mode: {loop_over_bench(work, p, lines)} | " + (
        " | ".join(lines) or f"exit {done.returncode}")
    return ("ok" if done.returncode == 0 else "fail"), (figures[:1200] + clock.note())


def loop_over_bench(work: Path, p: dict, lines: list[str]) -> str:
    """Part 4's loop tok/s (median of its timed steps, at the default log_every) over bench step's, per mode."""
    words = []
    for mode in ("compiled", "eager"):
        bench = next((float(ln.split()[3].replace(",", "")) for ln in lines
                      if ln.startswith(f"{mode} in model ")), None)
        loop = [m["tok_s"] for m in (read_metrics(work / mode / "run", "train")
                                     if (work / mode / "run" / "metrics.jsonl").exists() else [])
                if p["warm_steps"] < m["step"] <= p["warm_steps"] + p["timed_steps"]]
        if bench and loop:
            words.append(f"{mode} {median(loop):,.0f} / {bench:,.0f} = {median(loop) / bench:.3f}")
        else:
            words.append(f"{mode}: {'no part 4 ' + mode + ' run' if not loop else 'no bench figure'}")
    return "loop / bench step tok/s (goal >= 0.97): " + ", ".join(words)


def part_run(work: Path, p: dict, dry: bool) -> tuple[str, str]:
    """Part 4 compiled's run carried on for `extend_steps` more under `minilmd run` (MINILMD_FAULT kills its trainer
    at its first new step), restarted by the supervisor, done. Its compile cache is the run's own, under its scratch,
    as the supervisor chooses it (gpu-check's shared cache variables are removed for it): part 4 compiled's trainer
    compiled into that same folder, so the restart reads what this run kept. Without part 4's run, the run starts
    from step 0 (its first compile cold). Part 5 determinism compares its final weights with an undisturbed run."""
    if not (work / "prepared" / "meta.json").exists():
        return "fail", "no corpus (part 0 failed)"
    took("supervised run")
    base = p["warm_steps"] + p["timed_steps"]
    steps = base + p["extend_steps"]
    from minilmd import names

    carried = (work / "compiled" / "scratch" / "checkpoints" / names.step_name(base)).is_dir()
    if not carried:
        took("fresh run")
        train_config(work, "compiled", p, True)
    config = work / "supervised.toml"
    text = (work / "compiled.toml").read_text(encoding="utf-8")
    for key, value in (("max_steps", steps), ("checkpoint_every", 4), ("log_every", 1)):
        text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
    config.write_text(text, encoding="utf-8")
    # carried on: killed at its first new step (its compile cache is warm from part 4's); from step 0: after its first
    # checkpoint (step 4) and compile, so that the restart still reads a cache the run made
    kill = base + 1 if carried else 6
    env = {"MINILMD_FAULT": f"sigkill@{kill}", **dict.fromkeys(CACHE_DIRS)}
    if dry:
        env["TORCHDYNAMO_DISABLE"] = "1"
    since = time.time()
    run = minilmd("run", str(config), env=env)
    left = kill_leftovers(work, since) if run.returncode != 0 else []  # a cut supervisor's trainer lives on
    run_dir = work / "compiled" / "run"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    exits = [e.get("cause") for e in events if e.get("event") == "child_exit"]
    admitted = next((e["message"] for e in events if e.get("transition") and e.get("new") == Phase.STAGING), "")
    figures = [f"{'part 4 compiled carried on from step ' + str(base) if carried else 'from step 0'} to {steps}, "
               f"SIGKILL at step {kill}", f"admitted: {admitted[:120]}", f"trainer ends: {exits}",
               f"run exit {run.returncode}" + (f" (its trainer's leftovers killed: {left})" if left else "")]
    killed = len(exits) >= 2 and exits[0] in (Cause.KILLED, Cause.OOM_KILL) and exits[-1] == Cause.DONE
    figures.append(restart_time(run_dir))
    ok = run.returncode == 0 and killed and "not measured" not in figures[-1]
    return ("ok" if ok else "fail"), "; ".join(figures + ["its weights against an undisturbed run: part 5 "
                                                          "determinism"])


def restart_time(run_dir: Path) -> str:
    """From the trainer's death (the supervisor's child_exit event) to the first optimizer step the next attempt
    logged (log_every = 1): backoff, the new process, imports, the resume, the first step (and its compile, when
    compiled)."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    died = next((e["time"] for e in reversed(events) if e.get("event") == "child_exit"
                 and e.get("cause") in ("killed", "oom_kill")),
                None)
    after = [m for m in read_metrics(run_dir, "train") if died is not None and m["time"] > died]
    if died is None or not after:
        return "restart time: not measured (no death or no step after it)"
    return (f"restart: {after[0]['time'] - died:.1f}s from the kill to the first new optimizer step (its compile "
            f"{after[0].get('compile_s', 0):.1f}s from the run's own cache)")


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
