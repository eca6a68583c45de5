"""`minilmd bench step`: one model's training step, eager against torch.compile, on this machine.

Copies of the same model (same config, same seeded init) train on the same random token rows in one process, their
steps interleaved (one order, then the reverse) so that a machine whose speed drifts slows all alike. The step is
the trainer's own (trainer/loop/step.py): autocast by the same rule (step.matmul_dtype), the objective's loss
summed over the targets inside the compiled module (TrainingForward, trainer/loop/objective.py), divided by the
batch's targets, backward, then optimizer_update (clip, AdamW from build_optimizer). Two more copies score the whole
micro-batch's logits outside the model, as the trainer did before the loss moved into the compiled graph: one run
shows both, eager and compiled (MODES). Two more train with the document mask (data.doc_mask, "-masked"): the same
rows cut into documents of MiniMind-like lengths (DOC_MEAN), each token attending only to its own document. The
first call of each compiled copy compiles; it is timed apart ("compile") and every copy gets the same untimed
warm-up steps.

The kernels are the loop's, chosen by the same functions `minilmd train` calls (one home): train.deterministic's
environment before CUDA starts and its deterministic algorithms (trainer/loop/determinism.py), then model.attention's
backend settled and applied (trainer/model/attention_choice.py: timed at the run's shape on CUDA with "auto", or
forced, as gpu-check forces the backend its part 4 run recorded); the "kernels" line says which. Otherwise the
bench and the loop would time different kernels.

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

import numpy as np
import torch

from minilmd.config import ConfigError, RunConfig, config_from_dict, load_config, parse_overrides
from minilmd.corpus_meta import corpus_train_tokens
from minilmd.protocol import EXIT_CONFIG
from minilmd.trainer.model.loss import IGNORE_INDEX, next_token_loss

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


LOSS_IN_MODEL, LOSS_OUTSIDE = "in model", "outside"
MODES = {"eager": (False, LOSS_IN_MODEL), "compiled": (True, LOSS_IN_MODEL),
         "eager-outside": (False, LOSS_OUTSIDE), "compiled-outside": (True, LOSS_OUTSIDE)}
"""mode -> (compiled, where the loss is computed). The first two are the trainer's step as it is; the "-outside"
two score the whole micro-batch's logits outside the model (as the trainer did before the loss moved into the
forward), so that one run shows what the move is worth."""
MASKED_MODES = {"eager-masked": False, "compiled-masked": True}
"""mode -> compiled: the trainer's step as it is, on rows with document pieces (data.doc_mask)."""
DOC_MEAN = 262.0
"""Mean document length (BOS and EOS included) of the masked rows' documents, lognormal (sigma 0.75) as
MiniMind's pretraining corpus (tests/trainer_corpus.py: synthetic_prepared)."""


def document_positions(rows: int, seq_len: int, seed: int) -> torch.Tensor:
    """(rows, seq_len) int32 positions of consecutive windows over a stream of lognormal-length documents."""
    from minilmd.plan.docmask import window_positions

    rng = np.random.default_rng(seed)
    mu = np.log(DOC_MEAN) - 0.75 ** 2 / 2
    lengths = np.maximum(rng.lognormal(mu, 0.75, size=rows * seq_len // 2 + 1).astype(np.int64), 2)
    doc_starts = np.concatenate([[0], np.cumsum(lengths)])
    return torch.from_numpy(window_positions(np.arange(rows) * seq_len, seq_len, doc_starts))


class StepModel:
    """A model, its optimizer and the trainer's step (trainer/loop/step.py) on fixed rows of random tokens."""

    def __init__(self, cfg: RunConfig, device: torch.device, compiled: bool, backend: str,
                 loss: str = LOSS_IN_MODEL, masked: bool = False):
        from minilmd.trainer.loop import step as trainer_step
        from minilmd.trainer.loop.objective import DeviceBatch, TrainingForward, build_objective
        from minilmd.trainer.loop.train import build_optimizer
        from minilmd.trainer.model.minimind import MiniMindForCausalLM, next_token_labels

        torch.manual_seed(cfg.train.seed)
        self.model = MiniMindForCausalLM(cfg.model).to(device)
        self.optimizer = build_optimizer(self.model, cfg, device)
        # the trainer's objective with the model, compiled as the trainer compiles them (trainer/loop/objective.py)
        training = TrainingForward(self.model, build_objective(cfg))
        self.training_forward: Any = torch.compile(training, backend=backend) if compiled else training
        self.forward = torch.compile(self.model, backend=backend) if compiled else self.model
        self.trainer_step, self.loss = trainer_step, loss
        g = torch.Generator().manual_seed(cfg.train.seed)
        t = cfg.train
        self.x = torch.randint(0, cfg.model.vocab_size, (t.micro_batch_size, t.seq_len), generator=g).to(device)
        self.positions = document_positions(t.micro_batch_size, t.seq_len, t.seed).to(device) if masked else None
        # masked: a piece's first token is no target (batches/docmask.py: piece_targets), as in the trainer
        self.y = next_token_labels(self.x, None if self.positions is None else (self.positions != 0).to(torch.uint8))
        self.batch = DeviceBatch(self.x, self.y, self.positions)
        self.n_targets = int((self.y != IGNORE_INDEX).sum()) * t.grad_accum  # the global batch's targets
        self.tokens = t.micro_batch_size * t.seq_len * t.grad_accum
        self.autocast = trainer_step.autocast_for(trainer_step.matmul_dtype(t.dtype, device), device)
        self.grad_accum, self.grad_clip = t.grad_accum, t.grad_clip
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def micro_batch_loss(self) -> torch.Tensor:
        if self.loss == LOSS_OUTSIDE:
            return next_token_loss(self.forward(self.x).logits, self.y, reduction="sum")
        return self.trainer_step.micro_batch_loss(self.training_forward, self.batch)[0]

    def step(self) -> tuple[float, float]:
        """(host seconds, wall seconds) of one optimizer step."""
        self.sync()
        t0 = time.perf_counter()
        for _ in range(self.grad_accum):
            with self.autocast():
                part = self.micro_batch_loss() / self.n_targets
            part.backward()
        self.trainer_step.optimizer_update(self.model, self.optimizer, self.grad_clip)
        host = time.perf_counter() - t0
        self.sync()
        return host, time.perf_counter() - t0


ALL_MODES = (*MODES, *MASKED_MODES)


def compare(cfg: RunConfig, device: torch.device, steps: int, warmup: int = 2, backend: str = "inductor",
            modes: tuple[str, ...] = ALL_MODES) -> tuple[dict[str, ModeResult], dict[str, ModeResult]]:
    """(results of the timed steps per mode, their steps interleaved; the first step of each compiled mode alone:
    tracing and code generation). `modes`: some of ALL_MODES (each compiled one costs a compile)."""
    models = {mode: StepModel(cfg, device, compiled, backend, loss) for mode, (compiled, loss) in MODES.items()
              if mode in modes}
    models.update({mode: StepModel(cfg, device, compiled, backend, masked=True)
                   for mode, compiled in MASKED_MODES.items() if mode in modes})
    firsts: dict[str, ModeResult] = {}
    for mode, model in models.items():
        if model.forward is not model.model:  # compiled
            first = firsts[mode] = ModeResult(mode, steps=1, tokens=models[mode].tokens)
            first.host_s, first.wall_s = models[mode].step()
    for model in models.values():
        for _ in range(warmup):
            model.step()
    results = {mode: ModeResult(mode) for mode in models}
    order = list(models)
    for i in range(steps):
        for mode in (order if i % 2 == 0 else order[::-1]):
            host, wall = models[mode].step()
            r = results[mode]
            r.steps, r.tokens, r.host_s, r.wall_s = r.steps + 1, r.tokens + models[mode].tokens, r.host_s + host, \
                r.wall_s + wall
    return results, firsts


def report(results: dict[str, ModeResult], firsts: dict[str, ModeResult], cfg: RunConfig, device: torch.device,
           backend: str, kernels: str = "") -> str:
    m, t = cfg.model, cfg.train
    r = results

    def ratio(a: str, b: str) -> str:
        return f"{r[a].tok_s / r[b].tok_s:.2f}x"

    lines = [
        f"bench step: model {m.hidden_size}x{m.num_hidden_layers} (heads {m.num_attention_heads}/"
        f"{m.num_key_value_heads}, vocab {m.vocab_size}), seq_len {t.seq_len}, {t.micro_batch_size} rows x "
        f"{t.grad_accum} micro-batches, {device}, torch threads {torch.get_num_threads()}, compile backend "
        f"{backend}, {r['eager'].steps} timed steps each",
        f"{'mode':16} {'loss':>8} {'tok/s':>10} {'host ms/step':>13} {'wall ms/step':>13}",
        *(f"{mode:16} {MODES.get(mode, (None, LOSS_IN_MODEL))[1]:>8} {x.tok_s:10,.0f} {x.host_ms:13.1f} "
          f"{x.wall_ms:13.1f}"
          for mode, x in r.items())]
    if kernels:
        lines.insert(1, f"kernels: {kernels}")
    if {"compiled", "eager"} <= r.keys():
        lines.append(f"compiled/eager tok/s: {ratio('compiled', 'eager')}; host time per step: "
                     f"{r['compiled'].host_ms / r['eager'].host_ms:.2f}x; the first compiled step (compile) took "
                     f"{firsts['compiled'].wall_s:.1f} s")
    if {"compiled", "eager", "compiled-outside", "eager-outside"} <= r.keys():
        lines.append(f"loss in the model/outside tok/s: compiled {ratio('compiled', 'compiled-outside')}, eager "
                     f"{ratio('eager', 'eager-outside')}; compiled (loss in the graph)/eager-outside "
                     f"{ratio('compiled', 'eager-outside')}")
    if {"compiled", "eager", "compiled-masked", "eager-masked"} <= r.keys():
        lines.append(f"masked/unmasked tok/s ratio (data.doc_mask; below 1x, its cost): compiled "
                     f"{ratio('compiled-masked', 'compiled')}, eager {ratio('eager-masked', 'eager')}")
    return "\n".join(lines)


def load(config_path: str | None, overrides: list[str]) -> RunConfig:
    """The run config's model and train sections (its paths are not used), or SMALL; then the overrides."""
    if config_path:
        return load_config(config_path, overrides, train_tokens_of=corpus_train_tokens)
    raw: dict[str, Any] = copy.deepcopy(SMALL)
    for section, values in parse_overrides(overrides).items():
        raw.setdefault(section, {}).update(values)
    return config_from_dict(raw, "bench step defaults", train_tokens_of=corpus_train_tokens)


def main(config_path: str | None, steps: int = 10, overrides: list[str] | None = None,
         backend: str = "inductor", modes: str = "") -> int:
    try:
        cfg = load(config_path, list(overrides or []))
    except ConfigError as e:
        print(f"minilmd bench step: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if steps < 1:
        print("minilmd bench step: --steps must be at least 1", file=sys.stderr)
        return EXIT_CONFIG
    chosen = tuple(m.strip() for m in modes.split(",") if m.strip()) or ALL_MODES
    unknown = [m for m in chosen if m not in ALL_MODES]
    if unknown:
        print(f"minilmd bench step: unknown mode(s) {', '.join(unknown)}; the modes: {', '.join(ALL_MODES)}",
              file=sys.stderr)
        return EXIT_CONFIG
    try:
        device, kernels = loop_kernels(cfg)
    except ConfigError as e:
        print(f"minilmd bench step: {e}", file=sys.stderr)
        return EXIT_CONFIG
    results, firsts = compare(cfg, device, steps, backend=backend, modes=chosen)
    print(report(results, firsts, cfg, device, backend, kernels), flush=True)
    return 0


def loop_kernels(cfg: RunConfig) -> tuple[torch.device, str]:
    """The device and the kernels `minilmd train` would run this config with, set as it sets them (trainer/loop/
    train.py's run and Trainer): the cuBLAS workspace before CUDA starts, deterministic algorithms, the attention
    backend settled and applied. (the device, what was chosen, in words)."""
    from minilmd.trainer.loop import determinism
    from minilmd.trainer.loop import step as trainer_step
    from minilmd.trainer.loop.distributed import init_distributed
    from minilmd.trainer.model import attention_choice

    determinism.prepare_environment(cfg)
    dist = init_distributed(cfg)
    deterministic = determinism.apply(cfg, dist.device.type)
    bf16 = trainer_step.matmul_dtype(cfg.train.dtype, dist.device) == "bf16"
    record = attention_choice.settle(cfg, dist, bf16, None)
    return dist.device, (f"attention {record['attention']} ({record['attention_how']}), "
                         f"{determinism_words(cfg, dist.device.type, deterministic)}, as `minilmd train` runs them")


def determinism_words(cfg: RunConfig, device_type: str, deterministic: bool) -> str:
    """What the kernels line says of determinism.apply's choice, and why where the config asked otherwise (found by a
    new user: "deterministic algorithms off (train.deterministic = true)" on a CPU read as a contradiction)."""
    if deterministic or not cfg.train.deterministic:
        return (f"deterministic algorithms {'on' if deterministic else 'off'} (train.deterministic = "
                f"{str(cfg.train.deterministic).lower()})")
    return (f"deterministic algorithms off (train.deterministic = true applies on CUDA only: the {device_type}'s "
            "kernels are deterministic already)")
