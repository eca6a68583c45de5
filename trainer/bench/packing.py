"""`minilmd bench packing`: what packing saves over MiniMind's padded rows, measured on your corpus and hardware.

The same model (same config, same seeded init) trains the same number of optimizer steps three times in one
process, on packed windows, on the same windows with `data.doc_mask` (block-causal attention per document,
"masked") and on padded one-document rows, through the trainer's own step (Trainer.train_step), their steps
interleaved (the order rotating every step).
Real tokens are the non-PAD ones. Padded rows cost as much compute as packed rows, so padding can at best reach
(1 - PAD share) of packing's real tokens/s: the packed/padded ratio cannot exceed 1 / (1 - PAD share). The bench
prints both rates, the ratio, the PAD share it measured over the rows it trained, that limit, and how close the
ratio comes to it (the goal is >= 95 %: anything less is overhead of the packed path). The masked/packed ratio is
what the document mask costs (on CPU a dense mask through SDPA: no kernel skips the masked blocks).

The steps run with the torch threads the supervisor gives the trainer on that device (minilmd/threads.py: on CPU
the idle cores), not torch's default of every core: on a busy host those OpenMP threads wait for cores at every
barrier, and the bench timed that wait, step to step a different share of it, rather than the rows (docs/training.md,
packing benchmark). Step times that vary more than SPREAD_WARNING-fold within a mode are said.
"""
from __future__ import annotations

import copy
import gc
import json
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

from minilmd.config import ConfigError, RunConfig
from minilmd.probes import load_checked
from minilmd.protocol import EXIT_CONFIG
from minilmd.trainer.loop import cpu_threads

SPREAD_WARNING = 2.0
"""Slowest over fastest timed step of one mode above which the report warns that the host's load, not the rows,
may be what it measured."""


@dataclass
class ModeResult:
    mode: str
    step_seconds: tuple[float, ...]
    real_tokens: int
    row_tokens: int

    @property
    def steps(self) -> int:
        return len(self.step_seconds)

    @property
    def seconds(self) -> float:
        return sum(self.step_seconds)

    @property
    def spread(self) -> float:
        """The slowest timed step over the fastest."""
        return max(self.step_seconds) / min(self.step_seconds)

    @property
    def tok_s(self) -> float:
        return self.real_tokens / self.seconds

    @property
    def pad_share(self) -> float:
        return 1.0 - self.real_tokens / self.row_tokens


MODES = ("packed", "masked", "padded")
"""The rows compared: packed windows, the same with data.doc_mask, padded documents."""


def preference_refusal(cfg: RunConfig, command: str) -> str | None:
    """Why `command` (bench packing, bench sft) does not bench cfg's corpus when it is a preference corpus: a DPO
    run's pairs are length-bucketed whatever data.mode says (minilmd/plan/pairs.py), so the row modes compared here
    are all the same rows, and each mode's Trainer would first run DPO's whole reference pass (minutes to hours)
    before its first step. None for any other corpus (or one whose meta.json cannot be read: the Trainer says why)."""
    from minilmd.corpus_meta import data_format_of, read_corpus_meta

    meta = read_corpus_meta(cfg.data.prepared)
    if meta is None or data_format_of(meta) != "dpo":
        return None
    return (f"minilmd {command}: {cfg.data.prepared} is a preference corpus (prepared with --format dpo): a DPO run "
            "trains its pairs length-bucketed whatever data.mode says, so there are no row modes to compare, and "
            "each mode would first run the whole DPO reference pass; not benchmarked (`minilmd bench step --config "
            "CONFIG` times the model's steps)")


def row_bench_config(command: str, prepared: str, config_path: str, steps: int,
                     overrides: list[str] | None) -> RunConfig | None:
    """The checked config `command` (bench packing, bench sft) benchmarks the corpus `prepared` with; None, said on
    stderr, for a config error, fewer than one step, or a preference corpus (preference_refusal)."""
    try:
        cfg = load_checked(config_path, [*(overrides or []), f"data.prepared={json.dumps(prepared)}"])
    except ConfigError as e:
        print(f"minilmd {command}: {e}", file=sys.stderr)
        return None
    refused = f"minilmd {command}: --steps must be at least 1" if steps < 1 else preference_refusal(cfg, command)
    if refused:
        print(refused, file=sys.stderr)
        return None
    return cfg


def build_trainer(cfg: RunConfig, mode: str, total_steps: int, tmp: str):
    """A Trainer for `mode` (one of MODES) writing only under `tmp` (its run dir and scratch)."""
    from minilmd.trainer.loop import determinism
    from minilmd.trainer.loop.distributed import init_distributed
    from minilmd.trainer.loop.train import Trainer

    cfg = copy.deepcopy(cfg)
    cfg.run.dir, cfg.run.scratch, cfg.run.remote = f"{tmp}/{mode}/run", f"{tmp}/{mode}/scratch", ""
    cfg.override("data.mode", "padded" if mode == "padded" else "packed")
    cfg.override("data.doc_mask", mode == "masked")
    cfg.train.max_steps, cfg.train.max_tokens = total_steps, 0
    determinism.prepare_environment(cfg)  # the kernels `minilmd train` runs: before CUDA starts, as it does
    dist = init_distributed(cfg)
    determinism.apply(cfg, dist.device.type)
    return Trainer(cfg, dist)


def timed_step(trainer) -> tuple[float, int]:
    """(seconds, real tokens) of one optimizer step, device work included."""
    sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    loss, _, n_real = trainer.train_step()
    float(loss)  # waits for the device
    sync()
    trainer.step += 1
    return time.perf_counter() - t0, n_real


@dataclass
class Comparison:
    packed: ModeResult
    masked: ModeResult
    padded: ModeResult
    threads: int
    """torch's intra-op threads during the steps."""
    threads_why: str


def compare(cfg: RunConfig, steps: int, warmup: int = 2) -> Comparison:
    """Every mode of MODES side by side, their steps interleaved (packed, masked, padded, then masked, padded,
    packed, ...) so that a machine whose speed drifts (other jobs, clocks) slows them alike; `warmup` steps of
    each first, untimed; the Trainers built before, untimed; the trainer's threads (cpu_threads.held) throughout."""
    with tempfile.TemporaryDirectory(prefix="minilmd-bench-") as tmp:
        trainers = {mode: build_trainer(cfg, mode, warmup + steps, tmp) for mode in MODES}
        with cpu_threads.held(trainers["packed"].device.type, "minilmd bench packing") as (count, why):
            for trainer in trainers.values():
                for _ in range(warmup):
                    timed_step(trainer)
            seconds: dict[str, list[float]] = {mode: [] for mode in trainers}
            real = dict.fromkeys(trainers, 0)
            for i in range(steps):
                for mode in MODES[i % len(MODES):] + MODES[:i % len(MODES)]:
                    dt, n = timed_step(trainers[mode])
                    seconds[mode].append(dt)
                    real[mode] += n
        row_tokens = trainers["packed"].global_batch * cfg.train.seq_len * steps
        del trainers
        gc.collect()
    packed, masked, padded = (ModeResult(m, tuple(seconds[m]), real[m], row_tokens) for m in MODES)
    return Comparison(packed, masked, padded, count, why)


def spread_warning(results: tuple[ModeResult, ...]) -> list[str]:
    """A line when one mode's step times vary more than SPREAD_WARNING-fold (none otherwise)."""
    worst = max(results, key=lambda r: r.spread)
    if worst.spread <= SPREAD_WARNING:
        return []
    return [f"warning: {worst.mode} steps took {min(worst.step_seconds):.3f} to {max(worst.step_seconds):.3f} s "
            f"({worst.spread:.1f}x): the host's load moves these figures; rerun with more --steps, or when it is idle"]


def doc_mask_ratio(masked_over_unmasked: float) -> str:
    """The ratio, said as data.doc_mask's cost only where the mask is slower: user10 #7 read "1.11x (the cost of
    data.doc_mask)" of a masked run that was faster (the host's load moves both)."""
    x = masked_over_unmasked
    if x < 1:
        return f"{x:.2f}x (the cost of data.doc_mask: {1 - x:.0%} fewer tokens/s)"
    return f"{x:.2f}x (data.doc_mask's ratio: no cost measured)"


def report(c: Comparison, cfg: RunConfig) -> str:
    packed, masked, padded = c.packed, c.masked, c.padded
    ratio = packed.tok_s / padded.tok_s
    limit = 1.0 / (1.0 - padded.pad_share)
    t = cfg.train
    return "\n".join([
        f"bench packing: {cfg.data.prepared}, model {cfg.model.hidden_size}x{cfg.model.num_hidden_layers}, "
        f"seq_len {t.seq_len}, {t.micro_batch_size} rows x {t.grad_accum} micro-batches, {packed.steps} timed steps, "
        f"torch threads {c.threads} ({c.threads_why})",
        f"{'mode':8} {'real tok/s':>12} {'s/step':>8} {'PAD share':>10}",
        *(f"{r.mode:8} {r.tok_s:12,.0f} {r.seconds / r.steps:8.3f} {r.pad_share:10.1%}"
          for r in (packed, masked, padded)),
        f"packed/padded real tokens/s: {ratio:.2f}x; limit 1/(1 - PAD share) = {limit:.2f}x; "
        f"reached {ratio / limit:.1%} of the limit (goal >= 95%)",
        f"masked/packed real tokens/s: {doc_mask_ratio(masked.tok_s / packed.tok_s)}",
        *spread_warning((packed, masked, padded)),
    ])


def main(prepared: str, config_path: str, steps: int = 20, overrides: list[str] | None = None) -> int:
    if (cfg := row_bench_config("bench packing", prepared, config_path, steps, overrides)) is None:
        return EXIT_CONFIG
    print(report(compare(cfg, steps), cfg), flush=True)
    return 0
