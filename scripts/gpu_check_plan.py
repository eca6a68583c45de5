"""The time plan of scripts/gpu-check on one H200: what each part costs, estimated from what it runs (trainer
starts, steps x step time, compiles, MiniMind's runs), and each part's share of a --budget.

A lent device machine gives a session 15 minutes of device time in all (its start of a few minutes included) and at
most 10 minutes a command: the figures issue 41 asks for come from one command (`run`: --budget 540, the 600 s
command less its setup and the logs' archive, COMMAND_S and RESERVE_S), whose estimates leave about 1.15x
headroom; the parts it does not ask for go to a second, shorter command (`run second`) that may not fit the lease.

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

STARTED = time.monotonic()
"""When this process imported the plan: a part's process does at its start, so every PartClock of the part counts
its seconds from there."""
COMMAND_S = {"order": 600, "second": 300}
"""The device tool's limit of each call of scripts/gpu-check-device (`run`, `run second`): its timeout_s."""
RESERVE_S = 40
"""What gpu-check-device keeps of a call's seconds besides its setup: the logs' archive, the last part's kill and
what its runs left (up to 10 s of reaping), the tool's own margin."""
SETUP_S = 20
"""The device call's setup before gpu-check (links, the wheels' install, the requirements' imports): its budget is
COMMAND_S less RESERVE_S less the setup's own seconds (bash's SECONDS), about this."""
BUDGET_S = {call: seconds - RESERVE_S - SETUP_S for call, seconds in COMMAND_S.items()}
"""--budget of each call, as the setup usually leaves it: 540 s and 240 s."""

TOKENS = 64 * 1024
"""Part 4's tokens a step: micro-batch 64 x seq_len 1024."""
# measured (issue 41's lease)
EAGER_STEP_S = TOKENS / 356_369
"""Deterministic eager (train.deterministic, the default): 0.935x of the 381,493 tok/s of torch's default kernels."""
NONDET_EAGER_STEP_S = TOKENS / 381_493
COLD_COMPILE_S = 38.9
NONDET_COMPILED_STEP_S = TOKENS / 865_522
MINIMIND_EAGER_STEP_S = TOKENS / 401_454
SECOND_SHAPE_STEP_S = 64 * 768 / 469_276 / 0.935
"""768 x 16 at T=768, micro-batch 64, compiled: 469,276 tok/s measured with default kernels, the eager cost of
determinism assumed."""
RESTART_S = 13.0
"""SIGKILL to the first heartbeat of the restarted trainer, eager: the supervisor's backoff, the new process, the
resume's read."""
# estimated
COMPILED_STEP_S = NONDET_COMPILED_STEP_S / 0.935
"""Deterministic compiled: the eager cost of determinism assumed (part 5 determinism measures it)."""
START_S = 12.0
"""`minilmd train` from its command to its first step (imports, CUDA, the model, the attention kernel's timing):
the measured restart less the backoff and the admission poll, plus the first step."""
TRAINER_S = 4.0
"""Another Trainer in the same process (bench sft's: its model, optimizer and sampler, and on CUDA its own timing
of the attention backends, model.attention = "auto")."""
WARM_COMPILE_S = 10.0
"""A compile whose graph the inductor cache holds (tracing still runs): the same graph, the same
are_deterministic_algorithms_enabled (part of inductor's cache key)."""
KERNEL_WARM_COMPILE_S = 20.0
"""Another graph of the same model (the loss outside, the doc mask), deterministic as the cached one: its kernels
mostly cached. A graph under torch's default kernels (train.deterministic off) is another cache key: cold."""
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
MINIMIND_DPO_S = 40.0
"""MiniMind's train_dpo.py: the seconds of the part's own it needs left to be started (gpu_check_dpo's
MINIMIND_MIN_S): its copy, imports, policy and reference models, 25 steps."""
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
        "4 second shape": [("start", CLI_S + START_S), ("cold compile of 16 layers", 1.5 * COLD_COMPILE_S),
                           (f"{run} steps", run * SECOND_SHAPE_STEP_S), ("2 saves", 2 * SAVE_S)],
        "5 run": [("supervisor, admission", CLI_S + 4.0),
                  ("attempt 1: start, warm compile, killed after its first step", START_S + WARM_COMPILE_S),
                  ("restart: backoff, start, warm compile", RESTART_S + WARM_COMPILE_S),
                  (f"{s['extend_steps']} steps", s["extend_steps"] * COMPILED_STEP_S), ("2 saves", 2 * SAVE_S)],
        "5 determinism": [
            ("4 runs at once: start, warm compile, the rewrites", START_S + WARM_COMPILE_S + TORCH_S),
            (f"their steps at once ({run} + 2 x {resumed} eager, {run + s['extend_steps']} compiled)",
             together + 2 * SAVE_S),
            ("6 finals verified at once", VERIFY_S),
            (f"compiled, default kernels (a cold compile: another cache key), {nondet} steps",
             START_S + COLD_COMPILE_S + nondet * NONDET_COMPILED_STEP_S + SAVE_S)],
        "6 minimind": [("MiniMind compiled: start, cold compile", MINIMIND_START_S + MINIMIND_COLD_COMPILE_S),
                       (f"{mm} compiled steps", mm * MINIMIND_COMPILED_STEP_S)],
        "8 sft": [("chats written, prepared (CPU)", CPU_PREPARE_S["8 sft"]),
                  (f"bench sft: start, 3 more Trainers (each times attention), 4 modes x {s['sft_steps'] + 2} steps",
                   START_S + 3 * TRAINER_S + 4 * (s["sft_steps"] + 2) * SFT_STEP_S),
                  (f"MiniMind train_full_sft.py: start, {mm} steps", MINIMIND_START_S + mm * SFT_STEP_S)],
        "9 dpo": [("pairs written, prepared (CPU)", CPU_PREPARE_S["9 dpo"]),
                  ("SFT stage: start, 5 steps, export", START_S + 5 * SFT_STEP_S + SAVE_S + TORCH_S),
                  ("DPO: start, reference, 25 steps", START_S + 3.0 + 25 * DPO_STEP_S),
                  ("MiniMind train_dpo.py: its least (copy, start, two models, 25 steps)", MINIMIND_DPO_S)],
        "3 attention": [("torch, CUDA, 4 backends timed", TORCH_S + 3.0)],
        "7 oom": [("start, the OOM", CLI_S + START_S + 2.0)],
        "4 bench step": [("start", CLI_S + START_S),
                         ("compiled: part 4 compiled's graph, deterministic both, cached", WARM_COMPILE_S),
                         (f"eager and compiled x {s['bench_steps'] + 2} steps, deterministic",
                          (s["bench_steps"] + 2) * (EAGER_STEP_S + COMPILED_STEP_S))],
        "2 admission": [("NVML, a 1 GiB CUDA process", TORCH_S + 4.0)],
    }


CONCURRENT_SLOWDOWN = 1.5
"""Runs sharing the GPU (part 5 determinism's): the longest one's steps, 1.5x (eager steps are host-bound: the GPU
idles most of an eager step, so the others' kernels fit in between; an estimate)."""
OPTIONAL_S = {
    "minimind eager": MINIMIND_START_S + 30 * MINIMIND_EAGER_STEP_S,
    "the cost of determinism eager": START_S + (SHAPE["warm_steps"] + SHAPE["nondet_steps"]) * NONDET_EAGER_STEP_S
    + SAVE_S,
    "bench step's other modes": KERNEL_WARM_COMPILE_S + COLD_COMPILE_S + 12 * 2 * (
        NONDET_EAGER_STEP_S + NONDET_COMPILED_STEP_S),
}
"""What a part runs only when its share has room past the plan (each measured on issue 41's lease): MiniMind's
eager pretraining beside part 4 eager (1.40x then), the eager cost of determinism (0.935x then, by hand), bench
step's loss-outside and doc-mask modes (1.01x, 0.97x / 0.91x then)."""


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


TIMEOUTS = {"0 corpus": 120, "1 versions": 60, "2 admission": 90, "3 attention": 90, "4 eager": 180,
            "4 compiled": 300, "4 second shape": 240, "4 bench step": 240, "5 run": 240, "5 determinism": 300,
            "6 minimind": 420, "7 oom": 90, "8 sft": 300, "9 dpo": 180}
"""Seconds per part without a --budget (the dry run gets the same bounds; its parts take seconds). Under a --budget
each part gets its share instead (part_timeout), in proportion to its estimate on an H200 (ESTIMATE_S)."""
MIN_PART_S = 20
"""Under --budget, a part is started only with at least this many seconds left (the quickest take about 5 s)."""
MIN_S = {"9 dpo": 60}
"""Parts that need more than MIN_PART_S to show anything: two trainers' start-ups, a preparation and an export."""


def part_timeout(name: str, left: float | None, remaining: list[str] | None = None) -> float | None:
    """A part's timeout: its own, or under a --budget its share of the seconds `left` (its estimate's share of the
    estimates of the parts `remaining`, itself first: one part overrunning is cut at its share instead of starving
    the parts after it), never under its minimum; None when too little is left to start it."""
    if left is None:
        return TIMEOUTS[name]
    least = MIN_S.get(name, MIN_PART_S)
    if left < least:
        return None
    later = (remaining or [name])[1:]
    # no more than leaves each part after it its minimum to start, unless that is under its own estimate
    kept = sum(MIN_S.get(n, MIN_PART_S) for n in later)
    cap = max(left - kept, ESTIMATE_S.get(name, 0.0))
    return min(TIMEOUTS[name], left, max(least, min(share(name, left, remaining or [name]), cap)))


PART_S_ENV = "MINILMD_GPU_CHECK_PART_S"


class PartClock:
    """A part's own seconds (MINILMD_GPU_CHECK_PART_S, its timeout): what of its work fits, and what it left out."""

    def __init__(self, started: float = STARTED) -> None:
        """`started`: when the part's seconds began (monotonic): its process's start, by default. Unbounded outside a
        part's process (no MINILMD_GPU_CHECK_PART_S: a test calling a part's function, maybe minutes after this
        module was first imported), as gpu_check_part.time_left is."""
        seconds = os.environ.get(PART_S_ENV)
        self.deadline = started + float(seconds) if seconds is not None else float("inf")
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


def table(order: list[str], budget: float) -> str:
    """The estimate table, markdown: part, seconds, its timeout under `budget` when every part before it took its
    estimate, what they are."""
    items = estimate()
    lines = ["| part | est. s | timeout s | from |", "|---|---:|---:|---|"]
    left = budget
    for i, name in enumerate(order):
        timeout = part_timeout(name, left, order[i:])
        lines.append(f"| {name} | {ESTIMATE_S[name]:.0f} | {'-' if timeout is None else f'{timeout:.0f}'} | "
                     + "; ".join(f"{what} {s:.1f}" for what, s in items[name]) + " |")
        left -= ESTIMATE_S[name]
    total = sum(ESTIMATE_S[n] for n in order)
    lines.append(f"| **all** | **{total:.0f}** | | of the --budget of {budget:.0f} s: {budget / total:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    from pathlib import Path

    device = (Path(__file__).resolve().parent / "gpu-check-device").read_text(encoding="utf-8")
    for variable in ("order", "second"):
        print(f"`run{' second' if variable == 'second' else ''}`:\n")
        print(table(device.split(f'\n{variable}="', 1)[1].split('"', 1)[0].split(","), BUDGET_S[variable]) + "\n")
    print(f"\nparts 0-7 as on issue 41's lease: estimated {estimate_old():.0f} s, measured 389 s")
