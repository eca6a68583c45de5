"""scripts/gpu-check part "5 determinism": train.deterministic (on by default) measured, as issue 41's lease had to
improvise it, reusing the runs parts 4 and 5 made rather than repeating them:
  * two undisturbed runs compared bit for bit (with torch's default kernels two GPU runs differed by 4.0e-3): part 4
    eager's run and a second one of the same config (its attention kernel forced to the one part 4's recorded);
  * a run killed and resumed against an undisturbed one: part 5 run's (part 4 compiled's run carried on under
    `minilmd run`, SIGKILLed, restarted) against a compiled run of the same length from step 0, on the kernels of
    the same compile cache;
  * an eager resume: part 4 eager's middle checkpoint, saved unmodified as the first of another run, resumed to the
    end: bit-exact against part 4 eager's own end (`fail` otherwise);
  * the negative control: the same checkpoint rewritten without the AdamW moments (zeroed: a fresh optimizer) must
    end different (`fail` if not caught: a comparison that cannot tell is no check);
  these four runs share the GPU at once (gpu_slots: as many as its free memory holds), their speed being no figure;
  their verdicts are printed as a provisional result before what follows, so that a part killed later keeps them;
  * what determinism costs: a compiled run with train.deterministic = false, alone, its median tok/s against part
    4 compiled's (which runs with the default, deterministic); its compile is cold (inductor's cache key holds
    are_deterministic_algorithms_enabled: part 4's kernels are not found); the same eager (measured by hand on
    issue 41's lease, 0.935x) when the part's share has room; each left out, and said so, when the part's share
    of the --budget has no room for it (MINILMD_GPU_CHECK_PART_S). Every `minilmd` command is cut at the part's
    time (gpu_check_part.minilmd).
In the dry run the same code runs on the CPU with the tiny model (compiled with TORCHDYNAMO_DISABLE=1).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

from gpu_check_plan import OPTIONAL_S, PartClock, estimate


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
    for name, drop in (("det-resume", None), ("det-no-optimizer", "optimizer")):
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
    at_once = f"{len(jobs)} runs {slots} at once on the GPU ({time.monotonic() - started:.0f}s)"
    h.verify_at_once([final(work / n, steps) for n in ("eager", "det-b", "det-resume", "det-no-optimizer")]
                     + ([final(supervised, extended), final(work / "det-undisturbed", extended)] if resumed else []))
    ok &= judge(work, h, codes, steps, middle, kernel, figures)
    figures.append(at_once)
    if resumed and codes.get("det-undisturbed") == 0:
        verdict, same = h.compare_weights(supervised / "scratch", work / "det-undisturbed" / "scratch", extended, True)
        figures.append(f"part 5 run's, SIGKILLed and restarted ({extended} steps compiled) vs an undisturbed one "
                       f"on the same compile cache: {verdict}")
        ok &= same
    else:
        ok = False
        figures.append("killed and resumed: " + ("the undisturbed compiled run failed" if resumed else
                                                  f"part 5 run did not finish its run (no step {extended})"))
    h.provisional("ok" if ok else "fail", "; ".join(figures) + "; cost of determinism: not measured yet")
    figures.append(cost_of_determinism(work, p, dry, h, train, clock, "; ".join(figures), ok))
    return ("ok" if ok else "fail"), "; ".join(figures) + clock.note()


def judge(work: Path, h: SimpleNamespace, codes: dict[str, int], steps: int, middle: int, kernel: str,
          figures: list[str]) -> bool:
    """The eager verdicts, each against part 4 eager's end: a second undisturbed run and a plain resume bit-exact,
    the resume without the AdamW moments caught as different. Whether all hold; `figures` gets each."""
    eager, ok = work / "eager" / "scratch", True
    for name, what in (("det-b", f"two undisturbed runs ({steps} steps eager, attention {kernel})"),
                       ("det-resume", f"eager resume from step {middle}"),
                       ("det-no-optimizer", f"resume from step {middle} without the AdamW moments")):
        if codes.get(name) != 0:
            figures.append(f"{what}: the run failed (exit {codes.get(name)})")
            ok = False
            continue
        verdict, same = h.compare_weights(work / name / "scratch", eager, steps, True)
        if name == "det-no-optimizer":  # the negative control: it must be told apart
            figures.append(f"{what}: {'caught as different' if not same else 'NOT CAUGHT'}")
            ok &= not same
        else:
            figures.append(f"{what}: {verdict}")
            ok &= same
    return ok


def final(run: Path, steps: int) -> Path:
    from minilmd import names

    return run / "scratch" / "checkpoints" / names.step_name(steps)


def rewrite_checkpoint(work: Path, config: Path, kept: Path, drop: str | None) -> None:
    """`kept` saved as the first checkpoint of the run of `config`, unmodified (`drop` None) or without `drop`
    ("optimizer": its moments zeroed; "rng": no RNG states): that run then resumes from it."""
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
    elif drop == "rng":
        state.pop("rng", None)
    param_names = json.loads((kept / OPTIMIZER_META).read_text(encoding="utf-8")).get("param_names")
    ckpt_io.save(cfg.checkpoint_dir, int(state["step"]), model_state, optimizer_state, state,
                 tokenizer=work / "prepared" / "tokenizer.json", param_names=param_names)


def cost_of_determinism(work: Path, p: dict, dry: bool, h: SimpleNamespace, train, clock: PartClock,
                        before: str, ok: bool) -> str:
    """Median tok/s with train.deterministic = false, compiled (then eager, when the share has room past the plan),
    each alone on the GPU, against part 4's deterministic runs; a mode whose planned seconds do not fit in the
    part's share is left out (clock.note). After each mode a provisional result: `before` (the verdicts) and it."""
    plan = dict(estimate()["5 determinism"])
    parts = []
    for compiled in (True, False):
        mode = "compiled" if compiled else "eager"
        planned = next(s for what, s in plan.items() if what.startswith("compiled, default kernels")) if compiled \
            else OPTIONAL_S["the cost of determinism eager"]
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
        done = h.minilmd("train", str(config), env=env)
        last = p["warm_steps"] + p["timed_steps"]  # part 4's own steps: part 5 run carries the compiled run on
        det, nondet = (h.median([m["tok_s"] for m in h.read_metrics(run, "train")
                                 if p["warm_steps"] < m["step"] <= last])
                       for run in (work / mode / "run", work / name / "run"))
        if done.returncode != 0 and nondet != nondet:  # NaN: no timed step before it failed or was cut
            parts.append(f"{mode}: the train.deterministic = false run failed (exit {done.returncode})")
            continue
        cut = "" if done.returncode == 0 else f", cut at exit {done.returncode}"
        parts.append(f"{mode} deterministic {det:,.0f} vs default kernels {nondet:,.0f} tok/s ({p['nondet_steps']} "
                     f"timed steps{cut}): {det / nondet:.3f}x ({time.monotonic() - started:.0f}s)")
        shutil.rmtree(work / name / "scratch" / "checkpoints", ignore_errors=True)  # 770 MB each, not looked at
        h.provisional("ok" if ok else "fail", f"{before}; cost of determinism: {', '.join(parts)}")
    return "cost of determinism: " + (", ".join(parts) or "not measured")
