"""scripts/gpu-check part "5 determinism": train.deterministic (on by default) measured, as issue 41's lease had to
improvise it. Each run is `minilmd train` of part 4's model and shapes for `run_steps` steps, a checkpoint every 4:
  * two undisturbed runs, compared bit for bit (with torch's default kernels two GPU runs differed by 4.0e-3);
  * a run SIGKILLed at step 8 (MINILMD_FAULT) and resumed, compared bit for bit with the undisturbed one;
  * negative controls, each a resume from that run's newest checkpoint rewritten without one part of its state: the
    AdamW moments (zeroed: a fresh optimizer) must be caught as different; without the RNG states the result is
    reported, not judged (a pretraining step draws no random numbers: its data order is a pure function of
    (seed, step) and there is no dropout, so identical weights are the expected answer there);
  * what determinism costs: eager and compiled runs with train.deterministic = false, their median tok/s against
    part 4 eager and compiled (which run with the default, deterministic).
In the dry run the same code runs on the CPU with the tiny model (compiled with TORCHDYNAMO_DISABLE=1).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

KILL_STEP = 8


def part_determinism(work: Path, p: dict, dry: bool, h: SimpleNamespace) -> tuple[str, str]:
    """`h`: gpu-check's helpers (minilmd, write_config, compare_weights, read_metrics, took)."""
    if not (work / "prepared" / "meta.json").exists():
        return "fail", "no corpus (part 0 failed)"
    h.took("deterministic runs")
    steps, figures, ok = p["run_steps"], [], True
    runs = {name: h.write_config(work, name, p, max_steps=steps, checkpoint_every=4, compile=False)
            for name in ("det-a", "det-b", "det-killed", "det-no-optimizer", "det-no-rng")}
    for name in ("det-a", "det-b"):
        if h.minilmd("train", str(runs[name])).returncode != 0:
            return "fail", f"undisturbed run {name} failed"
    verdict, same = h.compare_weights(work / "det-a" / "scratch", work / "det-b" / "scratch", steps, True)
    figures.append(f"two undisturbed runs: {verdict}")
    ok &= same
    from minilmd.checkpoint_select import find_latest

    killed = h.minilmd("train", str(runs["det-killed"]), env={"MINILMD_FAULT": f"sigkill@{KILL_STEP}"})
    source = find_latest([work / "det-killed" / "scratch" / "checkpoints"], log=print)
    if killed.returncode == 0 or source is None:
        return "fail", "; ".join(figures + [f"the run to kill ended {killed.returncode}, no checkpoint saved"])
    kept = work / "det-kept" / source.name  # the checkpoint the resume starts from, for the negative controls
    shutil.rmtree(kept.parent, ignore_errors=True)
    shutil.copytree(source, kept)
    resumed = h.minilmd("train", str(runs["det-killed"]))
    verdict, same = h.compare_weights(work / "det-killed" / "scratch", work / "det-a" / "scratch", steps, True)
    figures.append(f"SIGKILL at {KILL_STEP}, resumed from {source.name} (exit {resumed.returncode}): {verdict}")
    ok &= same and resumed.returncode == 0
    for name, drop in (("det-no-optimizer", "optimizer"), ("det-no-rng", "rng")):
        differs = negative_control(work, runs[name], kept, drop, steps, h)
        if drop == "optimizer":
            ok &= differs is True
            figures.append(f"resume without the AdamW moments: {'caught as different' if differs else 'NOT CAUGHT'}")
        else:
            figures.append(f"resume without the RNG states: {'different' if differs else 'identical'} (reported: "
                           f"pretraining draws no random numbers after the init)")
    figures.append(cost_of_determinism(work, p, dry, h))
    return ("ok" if ok else "fail"), "; ".join(figures)


def negative_control(work: Path, config: Path, kept: Path, drop: str, steps: int, h: SimpleNamespace) -> bool | None:
    """A resume from `kept` rewritten without `drop` ("optimizer": its moments zeroed; "rng": no RNG states), run to
    the end; whether its final weights differ from the undisturbed run's (None: it did not run)."""
    import torch

    from minilmd import scratch
    from minilmd.config import load_config
    from minilmd.names import OPTIMIZER_META
    from minilmd.trainer.checkpoint import save as ckpt_io

    cfg = load_config(config)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, False)  # this run's, then its first checkpoint
    model_state, optimizer_state, state = ckpt_io.load(kept)
    if drop == "optimizer":
        for per_param in optimizer_state["state"].values():
            for key in ("exp_avg", "exp_avg_sq"):
                per_param[key] = torch.zeros_like(per_param[key])
    else:
        state.pop("rng", None)
    names = json.loads((kept / OPTIMIZER_META).read_text(encoding="utf-8")).get("param_names")
    ckpt_io.save(cfg.checkpoint_dir, int(state["step"]), model_state, optimizer_state, state,
                 tokenizer=work / "prepared" / "tokenizer.json", param_names=names)
    if h.minilmd("train", str(config)).returncode != 0:
        return None
    _, same = h.compare_weights(cfg.scratch_dir, work / "det-a" / "scratch", steps, True)
    return not same


def cost_of_determinism(work: Path, p: dict, dry: bool, h: SimpleNamespace) -> str:
    """Median tok/s with train.deterministic = false, eager and compiled, against part 4's deterministic runs."""
    parts = []
    for compiled in (False, True):
        name, mode = f"nondet-{'compiled' if compiled else 'eager'}", "compiled" if compiled else "eager"
        ours = work / mode / "run" / "metrics.jsonl"
        if not ours.exists():
            parts.append(f"{mode}: no part 4 {mode} figure to compare")
            continue
        env = {"TORCHDYNAMO_DISABLE": "1"} if compiled and dry else None
        config = h.write_config(work, name, p, compile=compiled, deterministic=False,
                                max_steps=p["warm_steps"] + p["timed_steps"], checkpoint_every=100000)
        started = time.monotonic()
        if h.minilmd("train", str(config), env=env).returncode != 0:
            parts.append(f"{mode}: the train.deterministic = false run failed")
            continue
        det, nondet = (median_tok_s(h.read_metrics(run, "train"), p["warm_steps"])
                       for run in (work / mode / "run", work / name / "run"))
        parts.append(f"{mode} deterministic {det:,.0f} vs default kernels {nondet:,.0f} tok/s: "
                     f"{det / nondet:.3f}x ({time.monotonic() - started:.0f}s)")
    return "cost of determinism: " + ", ".join(parts)


def median_tok_s(lines: list[dict], warm_steps: int) -> float:
    timed = sorted(m["tok_s"] for m in lines if m["step"] > warm_steps)
    return timed[len(timed) // 2] if timed else float("nan")
