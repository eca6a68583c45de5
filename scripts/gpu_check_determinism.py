"""scripts/gpu-check part "5 determinism": train.deterministic (on by default) measured, as issue 41's lease had to
improvise it, reusing the runs parts 4 and 5 made rather than repeating them:
  * two undisturbed runs compared bit for bit (with torch's default kernels two GPU runs differed by 4.0e-3): part 4
    eager's run and a second one of the same config (its attention kernel forced to the one part 4's recorded);
  * a run killed and resumed against an undisturbed one: part 5 run's (part 4 compiled's run carried on under
    `minilmd run`, SIGKILLed, restarted) against a compiled run of the same length from step 0, on the kernels of
    the same compile cache;
  * negative controls, each a resume from part 4 eager's middle checkpoint rewritten without one part of its state:
    the AdamW moments (zeroed: a fresh optimizer) must be caught as different; without the RNG states the result is
    reported, not judged (a pretraining step draws no random numbers: its data order is a pure function of
    (seed, step) and there is no dropout, so identical weights are the expected answer there);
  these four runs share the GPU at once (gpu_slots: as many as its free memory holds), their speed being no figure;
  * what determinism costs: eager and compiled runs with train.deterministic = false, alone, their median tok/s
    against part 4 eager and compiled (which run with the default, deterministic); each left out, and said so,
    when the part's share of the --budget has no room for it (MINILMD_GPU_CHECK_PART_S).
In the dry run the same code runs on the CPU with the tiny model (compiled with TORCHDYNAMO_DISABLE=1).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

from gpu_check_plan import PartClock, estimate


def part_determinism(work: Path, p: dict, dry: bool, h: SimpleNamespace, train) -> tuple[str, str]:
    """`h`: gpu-check's helpers; `train`: scripts/gpu_check_train.py (part 4's config and run)."""
    from minilmd import names

    clock = PartClock()
    if not (work / "prepared" / "meta.json").exists():
        return "fail", "no corpus (part 0 failed)"
    h.took("deterministic runs")
    steps = p["warm_steps"] + p["timed_steps"]
    middle = p["warm_steps"] + p["timed_steps"] // 2
    kept = work / "eager" / "scratch" / "checkpoints" / names.step_name(middle)
    figures, ok = [], True
    if not kept.is_dir() or not final(work / "eager", steps).is_dir():
        h.took("part 4 eager run again")
        status, text = train.part_train(False)(work, p, dry)
        if status != "ok":
            return "fail", f"part 4 eager's run (the undisturbed one) failed: {text}"
    kernel = h.recorded_attention(work / "eager" / "scratch")
    jobs = [("det-b", ["train", str(train.train_config(work, "det-b", p, False, attention=kernel))], None)]
    for name, drop in (("det-no-optimizer", "optimizer"), ("det-no-rng", "rng")):
        config = train.train_config(work, name, p, False, attention=kernel)
        rewrite_checkpoint(work, config, kept, drop)
        jobs.append((name, ["train", str(config)], None))
    supervised = work / "compiled"
    extended = steps + p["extend_steps"]
    resumed = final(supervised, extended).is_dir()
    if resumed:
        compiled_kernel = h.recorded_attention(supervised / "scratch")
        config = train.train_config(work, "det-undisturbed", p, True, attention=compiled_kernel,
                                    max_steps=extended, checkpoint_every=extended, log_every=1)
        jobs.append(("det-undisturbed", ["train", str(config)], {"TORCHDYNAMO_DISABLE": "1"} if dry else None))
    slots = h.gpu_slots()
    h.took(f"{len(jobs)} runs, {slots} at once")
    started = time.monotonic()
    codes = h.together(jobs, slots)
    figures.append(f"{len(jobs)} runs {slots} at once on the GPU ({time.monotonic() - started:.0f}s)")
    h.verify_at_once([final(work / n, steps) for n in ("eager", "det-b", "det-no-optimizer", "det-no-rng")]
                     + ([final(supervised, extended), final(work / "det-undisturbed", extended)] if resumed else []))
    if codes.get("det-b") != 0:
        return "fail", "; ".join(figures + [f"the second undisturbed run failed (exit {codes.get('det-b')})"])
    verdict, same = h.compare_weights(work / "eager" / "scratch", work / "det-b" / "scratch", steps, True)
    figures.insert(0, f"two undisturbed runs ({steps} steps eager, attention {kernel}): {verdict}")
    ok &= same
    if resumed and codes.get("det-undisturbed") == 0:
        verdict, same = h.compare_weights(supervised / "scratch", work / "det-undisturbed" / "scratch", extended, True)
        figures.append(f"part 5 run's, SIGKILLed and restarted ({extended} steps compiled) vs an undisturbed one "
                       f"on the same compile cache: {verdict}")
        ok &= same
    else:
        ok = False
        figures.append("killed and resumed: " + ("the undisturbed compiled run failed" if resumed else
                                                  f"part 5 run did not finish its run (no step {extended})"))
    for name, what in (("det-no-optimizer", "the AdamW moments"), ("det-no-rng", "the RNG states")):
        differs = None
        if codes.get(name) == 0:
            differs = not h.compare_weights(work / name / "scratch", work / "eager" / "scratch", steps, True)[1]
        if name == "det-no-optimizer":
            ok &= differs is True
            figures.append(f"resume from step {middle} without {what}: "
                           f"{'caught as different' if differs else 'NOT CAUGHT' if differs is False else 'failed'}")
        else:
            figures.append(f"resume without {what}: {'different' if differs else 'identical'} (reported: "
                           f"pretraining draws no random numbers after the init)")
    figures.append(cost_of_determinism(work, p, dry, h, train, clock))
    return ("ok" if ok else "fail"), "; ".join(figures) + clock.note()


def final(run: Path, steps: int) -> Path:
    from minilmd import names

    return run / "scratch" / "checkpoints" / names.step_name(steps)


def rewrite_checkpoint(work: Path, config: Path, kept: Path, drop: str) -> None:
    """`kept` saved as the first checkpoint of the run of `config`, without `drop` ("optimizer": its moments zeroed;
    "rng": no RNG states): that run then resumes from it."""
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
    param_names = json.loads((kept / OPTIMIZER_META).read_text(encoding="utf-8")).get("param_names")
    ckpt_io.save(cfg.checkpoint_dir, int(state["step"]), model_state, optimizer_state, state,
                 tokenizer=work / "prepared" / "tokenizer.json", param_names=param_names)


def cost_of_determinism(work: Path, p: dict, dry: bool, h: SimpleNamespace, train, clock: PartClock) -> str:
    """Median tok/s with train.deterministic = false, eager and compiled, each alone on the GPU, against part 4's
    deterministic runs; a mode whose planned seconds do not fit in the part's share is left out (clock.note)."""
    plan = dict(estimate()["5 determinism"])
    parts = []
    for compiled in (False, True):
        mode = "compiled" if compiled else "eager"
        planned = next(s for what, s in plan.items() if what.startswith(f"{mode}, default kernels"))
        if not (work / mode / "run" / "metrics.jsonl").exists():
            parts.append(f"{mode}: no part 4 {mode} figure to compare")
            continue
        if not clock.fits(f"the cost of determinism {mode}", planned):
            continue
        name = f"nondet-{mode}"
        env = {"TORCHDYNAMO_DISABLE": "1"} if compiled and dry else None
        config = train.train_config(work, name, p, compiled, deterministic=False,
                                    max_steps=p["warm_steps"] + p["nondet_steps"], checkpoint_every=100000)
        started = time.monotonic()
        if h.minilmd("train", str(config), env=env).returncode != 0:
            parts.append(f"{mode}: the train.deterministic = false run failed")
            continue
        last = p["warm_steps"] + p["timed_steps"]  # part 4's own steps: part 5 run carries the compiled run on
        det, nondet = (h.median([m["tok_s"] for m in h.read_metrics(run, "train")
                                 if p["warm_steps"] < m["step"] <= last])
                       for run in (work / mode / "run", work / name / "run"))
        parts.append(f"{mode} deterministic {det:,.0f} vs default kernels {nondet:,.0f} tok/s ({p['nondet_steps']} "
                     f"timed steps): {det / nondet:.3f}x ({time.monotonic() - started:.0f}s)")
        shutil.rmtree(work / name / "scratch" / "checkpoints", ignore_errors=True)  # 770 MB each, not looked at
    return "cost of determinism: " + (", ".join(parts) or "not measured")

