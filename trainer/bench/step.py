"""`minilmd bench step`: one model's training step, eager against torch.compile, on this machine.

Two copies of the same model (same config, same seeded init) train on the same random token rows in one process:
one eager, one through torch.compile, their steps interleaved (eager, compiled, compiled, eager, ...) so that a
machine whose speed drifts slows both alike. The step is the trainer's: autocast by the same rule
(Trainer.matmul_dtype), the model's own loss, backward, clip, AdamW from build_optimizer. The first compiled call
compiles; it is timed apart ("compile") and both copies get the same untimed warm-up steps.

Per mode it prints tokens/s and two times per step: host (the Python thread's time until the step has been
issued: on CUDA the launch overhead that eager mode pays per op; on CPU all of the work) and wall (until the device
has finished). Token values do not change the cost of a step, so no corpus is needed; without --config the model
is MiniMind-3-shaped but small enough for a CPU (SMALL below).
"""
from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from minilmd.config import ConfigError, RunConfig, config_from_dict, load_config, parse_overrides
from minilmd.corpus.meta import corpus_train_tokens

SMALL: dict[str, dict[str, Any]] = {
    "run": {"name": "bench-step", "dir": "/nonexistent"},
    "data": {"prepared": "/nonexistent"},
    "model": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 6400, "max_position_embeddings": 1024},
    "train": {"seq_len": 128, "micro_batch_size": 8, "max_steps": 1, "device": "auto"},
}
"""MiniMind-3's shape (GQA 2:1, head_dim 64, its vocabulary) at a CPU's size: 4 x 256, 8 rows of 128 tokens."""


@dataclass
class ModeResult:
    mode: str
    steps: int = 0
    tokens: int = 0
    host_s: float = 0.0
    wall_s: float = 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def host_ms(self) -> float:
        return 1000 * self.host_s / self.steps

    @property
    def wall_ms(self) -> float:
        return 1000 * self.wall_s / self.steps


class StepModel:
    """A model, its optimizer and the trainer's step on fixed rows of random tokens."""

    def __init__(self, cfg: RunConfig, device: torch.device, compiled: bool, backend: str):
        from minilmd.trainer.loop.train import build_optimizer
        from minilmd.trainer.model.minimind import MiniMindForCausalLM

        torch.manual_seed(cfg.train.seed)
        self.model = MiniMindForCausalLM(cfg.model).to(device)
        self.optimizer = build_optimizer(self.model, cfg, device)
        self.forward = torch.compile(self.model, backend=backend) if compiled else self.model
        g = torch.Generator().manual_seed(cfg.train.seed)
        t = cfg.train
        self.x = torch.randint(0, cfg.model.vocab_size, (t.micro_batch_size, t.seq_len), generator=g).to(device)
        self.tokens = t.micro_batch_size * t.seq_len * t.grad_accum
        bf16 = t.dtype == "bf16" or (t.dtype == "auto" and device.type == "cuda")
        self.autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else None
        self.grad_accum, self.clip = t.grad_accum, t.grad_clip if t.grad_clip > 0 else float("inf")
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(self) -> tuple[float, float]:
        """(host seconds, wall seconds) of one optimizer step."""
        self.sync()
        t0 = time.perf_counter()
        for _ in range(self.grad_accum):
            if self.autocast is not None:
                with self.autocast():
                    loss = self.forward(self.x, labels=self.x).loss
            else:
                loss = self.forward(self.x, labels=self.x).loss
            (loss / self.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        host = time.perf_counter() - t0
        self.sync()
        return host, time.perf_counter() - t0


def compare(cfg: RunConfig, device: torch.device, steps: int, warmup: int = 2,
            backend: str = "inductor") -> tuple[ModeResult, ModeResult, ModeResult]:
    """(eager, compiled, compile) results: the timed steps of each mode interleaved; "compile" is the first
    compiled step alone (tracing and code generation)."""
    models = {"eager": StepModel(cfg, device, False, backend), "compiled": StepModel(cfg, device, True, backend)}
    first = ModeResult("compile", steps=1)
    first.host_s, first.wall_s = models["compiled"].step()
    first.tokens = models["compiled"].tokens
    for model in models.values():
        for _ in range(warmup):
            model.step()
    results = {mode: ModeResult(mode) for mode in models}
    for i in range(steps):
        for mode in (("eager", "compiled") if i % 2 == 0 else ("compiled", "eager")):
            host, wall = models[mode].step()
            r = results[mode]
            r.steps, r.tokens, r.host_s, r.wall_s = r.steps + 1, r.tokens + models[mode].tokens, r.host_s + host, \
                r.wall_s + wall
    return results["eager"], results["compiled"], first


def report(eager: ModeResult, compiled: ModeResult, first: ModeResult, cfg: RunConfig, device: torch.device,
           backend: str) -> str:
    m, t = cfg.model, cfg.train
    return "\n".join([
        f"bench step: model {m.hidden_size}x{m.num_hidden_layers} (heads {m.num_attention_heads}/"
        f"{m.num_key_value_heads}, vocab {m.vocab_size}), seq_len {t.seq_len}, {t.micro_batch_size} rows x "
        f"{t.grad_accum} micro-batches, {device}, torch threads {torch.get_num_threads()}, compile backend "
        f"{backend}, {eager.steps} timed steps each",
        f"{'mode':9} {'tok/s':>10} {'host ms/step':>13} {'wall ms/step':>13}",
        *(f"{r.mode:9} {r.tok_s:10,.0f} {r.host_ms:13.1f} {r.wall_ms:13.1f}" for r in (eager, compiled)),
        f"compiled/eager tok/s: {compiled.tok_s / eager.tok_s:.2f}x; host time per step: "
        f"{compiled.host_ms / eager.host_ms:.2f}x; the first compiled step (compile) took {first.wall_s:.1f} s",
    ])


def load(config_path: str | None, overrides: list[str]) -> RunConfig:
    """The run config's model and train sections (its paths are not used), or SMALL; then the overrides."""
    if config_path:
        return load_config(config_path, overrides, train_tokens_of=corpus_train_tokens)
    raw: dict[str, Any] = copy.deepcopy(SMALL)
    for section, values in parse_overrides(overrides).items():
        raw.setdefault(section, {}).update(values)
    return config_from_dict(raw, "bench step defaults", train_tokens_of=corpus_train_tokens)


def main(config_path: str | None, steps: int = 10, overrides: list[str] | None = None,
         backend: str = "inductor") -> int:
    try:
        cfg = load(config_path, list(overrides or []))
    except ConfigError as e:
        print(f"minilmd bench step: {e}", file=sys.stderr)
        return 2
    if steps < 1:
        print("minilmd bench step: --steps must be at least 1", file=sys.stderr)
        return 2
    from minilmd.trainer.loop.distributed import resolve_device

    try:
        device = resolve_device(cfg, 0)
    except ConfigError as e:
        print(f"minilmd bench step: {e}", file=sys.stderr)
        return 2
    eager, compiled, first = compare(cfg, device, steps, backend=backend)
    print(report(eager, compiled, first, cfg, device, backend), flush=True)
    return 0
