"""`minilmd bench sft`: what length bucketing saves over static padding, measured on your chat corpus and hardware.

The same model (same config, same seeded init) trains the same number of optimizer steps four times in one
process: static padding to seq_len ("padded", MiniMind's), dynamic padding with length bucketing ("bucketed", the
seed's), packed windows for reference, and padding-free rows of whole conversations ("padfree": packed mode with
data.doc_mask, minilmd/plan/docpacking.py); through the trainer's own step (Trainer.train_step), their steps
interleaved (the order rotates every step) so that a machine whose speed drifts slows all alike.

For each mode: real tokens/s (non-PAD tokens), target tokens/s (the assistant tokens the loss is taken on) and the
PAD share of the rows it trained (the sampler's own rows: bucketed ones at their width class, as the trainer runs
them). A row token costs the same compute whether it is PAD or not (up to attention's
quadratic term, which favours the shorter bucketed rows), so bucketed can at best beat static padding by
(1 - PAD_bucketed) / (1 - PAD_static): the bench prints the ratio of their real tokens/s, that limit, and how close
the ratio comes to it (the goal is >= 95 %: anything less is overhead of the bucketed path). The padfree/bucketed
ratio is what padding-free packing gains or loses against bucketing (less PAD, but the document mask's cost and
rows of the full seq_len).
"""
from __future__ import annotations

import gc
import tempfile
from dataclasses import dataclass

from minilmd.config import RunConfig
from minilmd.protocol import EXIT_CONFIG
from minilmd.trainer.bench.packing import build_trainer, row_bench_config, timed_step
from minilmd.trainer.loop import cpu_threads

MODES = ("padded", "bucketed", "packed", "masked")


@dataclass
class SftResult:
    mode: str
    steps: int = 0
    seconds: float = 0.0
    real_tokens: int = 0
    target_tokens: int = 0
    row_tokens: int = 0

    @property
    def tok_s(self) -> float:
        return self.real_tokens / self.seconds

    @property
    def target_s(self) -> float:
        return self.target_tokens / self.seconds

    @property
    def pad_share(self) -> float:
        return 1.0 - self.real_tokens / self.row_tokens


def step_rows(trainer, step: int) -> tuple[int, int]:
    """(row tokens PAD included, targets) of this rank's micro-batches of `step`: what the step computed on."""
    t = trainer.cfg.train
    rows = targets = 0
    for micro in range(t.grad_accum):
        b = trainer.sampler.batch(step, trainer.global_batch, micro=micro, micro_batch_size=t.micro_batch_size,
                                  first_row=trainer.first_row(step))
        rows += b.input_ids.size
        targets += b.n_targets
    return rows, targets


def compare(cfg: RunConfig, steps: int, warmup: int = 2) -> tuple[dict[str, SftResult], str]:
    """The modes side by side, their steps interleaved; warmup steps of each first, untimed; the trainer's threads
    throughout (cpu_threads.held). Returns the results and a line that says those threads."""
    with tempfile.TemporaryDirectory(prefix="minilmd-bench-sft-") as tmp:
        trainers = {mode: build_trainer(cfg, mode, warmup + steps, tmp) for mode in MODES}
        with cpu_threads.held(trainers["padded"].device.type, "minilmd bench sft") as (count, why):
            for trainer in trainers.values():
                for _ in range(warmup):
                    timed_step(trainer)
            results = {mode: SftResult(mode) for mode in MODES}
            for i in range(steps):
                for mode in MODES[i % len(MODES):] + MODES[:i % len(MODES)]:
                    trainer, r = trainers[mode], results[mode]
                    rows, targets = step_rows(trainer, trainer.step)
                    dt, n_real = timed_step(trainer)
                    r.steps += 1
                    r.seconds += dt
                    r.real_tokens += n_real
                    r.target_tokens += targets
                    r.row_tokens += rows
        del trainers
        gc.collect()
    return results, f"torch threads {count} ({why})"


def report(results: dict[str, SftResult], threads_line: str, cfg: RunConfig) -> str:
    s, b = results["padded"], results["bucketed"]
    ratio = b.tok_s / s.tok_s
    limit = (1.0 - b.pad_share) / (1.0 - s.pad_share)
    t = cfg.train
    names = {"padded": "static", "bucketed": "bucketed", "packed": "packed", "masked": "padfree"}
    return "\n".join([
        f"bench sft: {cfg.data.prepared}, model {cfg.model.hidden_size}x{cfg.model.num_hidden_layers}, "
        f"seq_len {t.seq_len}, {t.micro_batch_size} rows x {t.grad_accum} micro-batches, {s.steps} timed steps, "
        f"{threads_line}",
        f"{'mode':9} {'real tok/s':>11} {'target tok/s':>13} {'s/step':>8} {'PAD share':>10}",
        *(f"{names[r.mode]:9} {r.tok_s:11,.0f} {r.target_s:13,.0f} {r.seconds / r.steps:8.3f} {r.pad_share:10.1%}"
          for r in results.values()),
        f"bucketed/static real tokens/s: {ratio:.2f}x; limit (1 - PAD_bucketed)/(1 - PAD_static) = {limit:.2f}x; "
        f"reached {ratio / limit:.1%} of the limit (goal >= 95%)",
        f"padfree/bucketed real tokens/s: {results['masked'].tok_s / b.tok_s:.2f}x",
    ])


def main(prepared: str, config_path: str, steps: int = 10, overrides: list[str] | None = None) -> int:
    if (cfg := row_bench_config("bench sft", prepared, config_path, steps, overrides)) is None:
        return EXIT_CONFIG
    print(report(*compare(cfg, steps), cfg), flush=True)
    return 0
