"""The time plan of scripts/gpu-check on one H200: what each part costs, estimated from what it runs (trainer
starts, steps x step time, compiles, MiniMind's runs), and each part's share of a --budget.

A lent device machine gives a session 15 minutes of device time in all (its start of a few minutes included) and at
most 10 minutes a command, so the whole check runs within `--budget 480` in one command, leaving room for a rerun.

Measured on the last lease (issue 41; docs/training.md, "The last run on a GPU"; H200, torch 2.11.0+cu130):
  * part 4 at 768 x 8, T=1024, micro-batch 64 (65,536 tokens a step), bf16: eager 381,493 tok/s (0.172 s a step),
    compiled 865,522 tok/s (0.076 s); with deterministic algorithms eager ran at 0.935x (356,369 tok/s, 0.184 s);
  * a cold compile 38.9 s; a restart under `minilmd run`, from SIGKILL to the first heartbeat, 13 s (eager);
  * MiniMind's train_pretrain.py eager 401,454 tok/s counting its padding (0.163 s a step of 64 x 1024);
  * parts 0-7 as they were then (60 timed steps, 20-step runs, MiniMind eager only) 389 s together: `estimate_old`
    puts them at about that with the same figures (test_gpu_check_plan.py holds it within 15 %).
Estimated, not measured on a GPU (the next lease's table says how far off): the start of a trainer (START_S), a
compile whose graph or kernels are cached, deterministic compiled steps (the eager cost assumed), MiniMind compiled.
`python scripts/gpu_check_plan.py` prints the table (docs/training.md, "The device check").
"""
from __future__ import annotations

import os
import time

TOKENS = 64 * 1024
"""Part 4's tokens a step: micro-batch 64 x seq_len 1024."""
# measured (issue 41's lease)
EAGER_STEP_S = TOKENS / 356_369
"""Deterministic eager (train.deterministic, the default): 0.935x of the 381,493 tok/s of torch's default kernels."""
NONDET_EAGER_STEP_S = TOKENS / 381_493
COLD_COMPILE_S = 38.9
NONDET_COMPILED_STEP_S = TOKENS / 865_522
MINIMIND_EAGER_STEP_S = TOKENS / 401_454
RESTART_S = 13.0
"""SIGKILL to the first heartbeat of the restarted trainer, eager: the supervisor's backoff, the new process, the
resume's read."""
# estimated
COMPILED_STEP_S = NONDET_COMPILED_STEP_S / 0.935
"""Deterministic compiled: the eager cost of determinism assumed (part 5 determinism measures it)."""
START_S = 12.0
"""`minilmd train` from its command to its first step (imports, CUDA, the model, the attention kernel's timing):
the measured restart less the backoff and the admission poll, plus the first step."""
WARM_COMPILE_S = 10.0
"""A compile whose graph the inductor cache holds (tracing still runs)."""
KERNEL_WARM_COMPILE_S = 20.0
"""Another graph of the same model (train.deterministic off, the loss outside): its kernels mostly cached."""
SAVE_S = 1.0
"""A checkpoint of the 768 x 8 model and its AdamW state (770 MB): 0.76 s blocking measured, the write's end."""
VERIFY_S = 3.0
"""`minilmd verify` of one checkpoint (a torch-free command, the files hashed)."""
CLI_S = 1.5
"""A torch-free command or a part's own process."""
TORCH_S = 4.0
"""A process that imports torch and starts CUDA (parts 1, 2, 3, the rewrite of part 5's negative controls)."""
MINIMIND_START_S = 15.0
"""MiniMind's trainer to its first step (transformers, datasets, its model) and the count of its real tokens."""
MINIMIND_COMPILED_STEP_S = TOKENS / 800_000
MINIMIND_COLD_COMPILE_S = 40.0
SFT_STEP_S = 0.14
"""An eager SFT step of 64 x 768 (static padding's worst case; bucketed and packed rows are shorter)."""
DPO_STEP_S = 0.12
"""An eager DPO step of 16 pairs up to 1024 tokens (MiniMind's adds its reference model's forward)."""
CPU_PREPARE_S = {"0 corpus": 12.0, "8 sft": 8.0, "9 dpo": 10.0}
"""The CPU's share, measured on this project's 2 shared cores at the GPU's sizes (the H200's host has 16): part 0's
tokenizer and prepare 15 s, part 8's 6,000 chats written and prepared 5.6 s, part 9's 1,200 conversations made
into 1,016 pairs and prepared 6.0 s (and its SFT stage's chats prepared)."""

SHAPE = {"warm_steps": 10, "timed_steps": 30, "log_every": 10, "extend_steps": 8,
         "nondet_steps": 20, "bench_steps": 10, "minimind_timed": 20, "sft_steps": 10}
"""The GPU's step counts (scripts/gpu-check's GPU): part 4's 10 warm-up and 30 timed steps (three metrics lines
at the default log_every), part 5 run's 8 steps past part 4 compiled's (SIGKILL at the first), the cost of
determinism's 20 timed steps a mode, bench step's and bench sft's 10 a mode, MiniMind's 20 timed steps."""


def estimate(shape: dict | None = None) -> dict[str, list[tuple[str, float]]]:
    """Each part's items (what, seconds) on an H200: what the plan counts on. OPTIONAL_S's items run only when a
    part's share has room left for them."""
    s = {**SHAPE, **(shape or {})}
    run = s["warm_steps"] + s["timed_steps"]
    nondet = s["warm_steps"] + s["nondet_steps"]
    resumed = run - (s["warm_steps"] + s["timed_steps"] // 2)  # the negative controls: from part 4 eager's middle
    mm = 10 + s["minimind_timed"]
    together = max(run * EAGER_STEP_S, (run + s["extend_steps"]) * COMPILED_STEP_S) * CONCURRENT_SLOWDOWN
    return {
        "1 versions": [("python, torch, CUDA", TORCH_S), ("nvidia-smi twice", 3.0)],
        "0 corpus": [("tokenizer train, prepare (CPU)", CPU_PREPARE_S["0 corpus"])],
        "4 eager": [("start", CLI_S + START_S), (f"{run} steps", run * EAGER_STEP_S), ("2 saves", 2 * SAVE_S)],
        "4 compiled": [("start", CLI_S + START_S), ("cold compile", COLD_COMPILE_S),
                       (f"{run} steps", run * COMPILED_STEP_S), ("2 saves", 2 * SAVE_S)],
        "5 run": [("supervisor, admission", CLI_S + 4.0), ("attempt 1: start, killed at its first step", START_S),
                  ("restart: backoff, start, warm compile", RESTART_S + WARM_COMPILE_S),
                  (f"{s['extend_steps']} steps", s["extend_steps"] * COMPILED_STEP_S), ("2 saves", 2 * SAVE_S)],
        "5 determinism": [
            ("4 runs at once: start, warm compile, the rewrites", START_S + WARM_COMPILE_S + TORCH_S),
            (f"their steps at once ({run} + 2 x {resumed} eager, {run + s['extend_steps']} compiled)",
             together + 2 * SAVE_S),
            ("6 finals verified at once", VERIFY_S),
            (f"eager, default kernels, {nondet} steps", START_S + nondet * NONDET_EAGER_STEP_S + SAVE_S),
            (f"compiled, default kernels, {nondet} steps",
             START_S + KERNEL_WARM_COMPILE_S + nondet * NONDET_COMPILED_STEP_S + SAVE_S)],
        "6 minimind": [("MiniMind compiled: start, cold compile", MINIMIND_START_S + MINIMIND_COLD_COMPILE_S),
                       (f"{mm} compiled steps", mm * MINIMIND_COMPILED_STEP_S)],
        "8 sft": [("chats written, prepared (CPU)", CPU_PREPARE_S["8 sft"]),
                  (f"bench sft: start, 4 modes x {s['sft_steps'] + 2} steps",
                   START_S + 4 * (s["sft_steps"] + 2) * SFT_STEP_S),
                  (f"MiniMind train_full_sft.py: start, {mm} steps", MINIMIND_START_S + mm * SFT_STEP_S)],
        "9 dpo": [("pairs written, prepared (CPU)", CPU_PREPARE_S["9 dpo"]),
                  ("SFT stage: start, 5 steps, export", START_S + 5 * SFT_STEP_S + SAVE_S + TORCH_S),
                  ("DPO: start, reference, 25 steps", START_S + 3.0 + 25 * DPO_STEP_S)],
        "3 attention": [("torch, CUDA, 4 backends timed", TORCH_S + 3.0)],
        "7 oom": [("start, the OOM", CLI_S + START_S + 2.0)],
        "4 bench step": [("start", CLI_S + START_S), ("compiled (its graph cached by 5 determinism)", WARM_COMPILE_S),
                         (f"eager and compiled x {s['bench_steps'] + 2} steps",
                          (s["bench_steps"] + 2) * (NONDET_EAGER_STEP_S + NONDET_COMPILED_STEP_S))],
        "2 admission": [("NVML, a 1 GiB CUDA process", TORCH_S + 4.0)],
    }


CONCURRENT_SLOWDOWN = 1.5
"""Runs sharing the GPU (part 5 determinism's): the longest one's steps, 1.5x (eager steps are host-bound: the GPU
idles most of an eager step, so the others' kernels fit in between; an estimate)."""
OPTIONAL_S = {
    "minimind eager": MINIMIND_START_S + 30 * MINIMIND_EAGER_STEP_S,
    "bench step's other modes": KERNEL_WARM_COMPILE_S + COLD_COMPILE_S + 12 * 2 * (
        NONDET_EAGER_STEP_S + NONDET_COMPILED_STEP_S),
    "minimind dpo": MINIMIND_START_S + 25 * DPO_STEP_S,
}
"""What a part runs only when its share has room past the plan (each measured on issue 41's lease or asked by no
open issue): MiniMind's eager pretraining beside part 4 eager (1.40x then), bench step's loss-outside and doc-mask
modes (1.01x, 0.97x / 0.91x then), MiniMind's train_dpo.py beside minilmd's DPO (issue 42)."""


def seconds(shape: dict | None = None) -> dict[str, float]:
    return {name: round(sum(s for _, s in items), 1) for name, items in estimate(shape).items()}


ESTIMATE_S = seconds()
"""Each part's estimated seconds on an H200 at the GPU's step counts."""


def estimate_old() -> float:
    """Parts 0-7 as they ran on issue 41's lease (60 timed steps, default kernels, part 5 eager with 20-step runs,
    bench step's 20 steps and three cold compiles, MiniMind eager only): measured together 389 s."""
    start = CLI_S + START_S
    return (ESTIMATE_S["1 versions"] + ESTIMATE_S["0 corpus"] + ESTIMATE_S["2 admission"] + ESTIMATE_S["3 attention"]
            + start + 70 * NONDET_EAGER_STEP_S + 2 * SAVE_S
            + start + COLD_COMPILE_S + 70 * NONDET_COMPILED_STEP_S + 2 * SAVE_S
            + start + 3 * COLD_COMPILE_S + 22 * 3 * (NONDET_EAGER_STEP_S + NONDET_COMPILED_STEP_S)
            + CLI_S + 4.0 + start + RESTART_S + start + 2 * 20 * NONDET_EAGER_STEP_S + 10 * SAVE_S + 2 * VERIFY_S
            + MINIMIND_START_S + 70 * MINIMIND_EAGER_STEP_S + ESTIMATE_S["7 oom"])


def share(name: str, left: float, remaining: list[str]) -> float:
    """`name`'s seconds of the `left` of a --budget: its estimate's share of the estimates of the parts still to run
    (`remaining`, itself first). A part that ends early leaves its spare to the parts after it, in the same
    proportion; one that overruns is cut at its share, and the parts after it keep theirs."""
    total = sum(ESTIMATE_S.get(n, 0.0) for n in remaining)
    if total <= 0 or name not in ESTIMATE_S:
        return left
    return left * ESTIMATE_S[name] / total


PART_S_ENV = "MINILMD_GPU_CHECK_PART_S"


class PartClock:
    """A part's own seconds (MINILMD_GPU_CHECK_PART_S, its timeout): what of its work fits, and what it left out."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + float(os.environ.get(PART_S_ENV, "600"))
        self.left_out: list[str] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def fits(self, what: str, seconds_needed: float) -> bool:
        """Whether `what`, planned at `seconds_needed` on an H200, fits in what is left (a margin of 5 s for the
        part's own end); if not, it is named in `note()`."""
        left = self.left() - 5
        if left >= seconds_needed:
            return True
        self.left_out.append(f"{what} (planned {seconds_needed:.0f}s, {max(left, 0):.0f}s of the part's left)")
        return False

    def note(self) -> str:
        return f"; left out: {'; '.join(self.left_out)}" if self.left_out else ""


def table(order: list[str]) -> str:
    """The estimate table, markdown: part, seconds, what they are."""
    items = estimate()
    lines = ["| part | est. s | from |", "|---|---:|---|"]
    for name in order:
        lines.append(f"| {name} | {ESTIMATE_S[name]:.0f} | "
                     + "; ".join(f"{what} {s:.1f}" for what, s in items[name]) + " |")
    lines.append(f"| **all** | **{sum(ESTIMATE_S[n] for n in order):.0f}** | of the --budget of 480 s |")
    return "\n".join(lines)


if __name__ == "__main__":
    from pathlib import Path

    device = (Path(__file__).resolve().parent / "gpu-check-device").read_text(encoding="utf-8")
    order = device.split('\norder="', 1)[1].split('"', 1)[0].split(",")
    print(table(order))
    print(f"\nparts 0-7 as on issue 41's lease: estimated {estimate_old():.0f} s, measured 389 s")
