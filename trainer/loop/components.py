"""The parts trainer/loop/train.py's Trainer builds from the config besides the model and the data: the number of
steps the budget allows, AdamW, and whether torch.compile runs."""
from __future__ import annotations

import math

import torch

from minilmd.config import ConfigError, RunConfig


def compile_enabled(setting: bool | str, device: torch.device) -> bool:
    """train.compile: true, false, or "auto": on CUDA, where eager mode is host-bound (docs/training.md), and not
    on CPU, where a cold compile costs minutes that a short CPU run never wins back."""
    return setting is True or (setting == "auto" and device.type == "cuda")


def total_steps_for_budget(cfg: RunConfig, global_batch: int, rows_per_epoch: int | None = None) -> int:
    """max_steps, ceil(max_tokens / tokens per step), ceil(max_epochs * rows per epoch / rows per step); with
    several, whichever ends first."""
    t = cfg.train
    budgets = []
    if t.max_steps:
        budgets.append(t.max_steps)
    if t.max_tokens:
        budgets.append(math.ceil(t.max_tokens / (global_batch * t.seq_len)))
    if t.max_epochs and rows_per_epoch:
        budgets.append(max(1, math.ceil(t.max_epochs * rows_per_epoch / global_batch)))
    if not budgets:
        raise ConfigError(["a budget is required: set train.max_steps, train.max_tokens or train.max_epochs"],
                          cfg.source)
    return min(budgets)


def build_optimizer(model: torch.nn.Module, cfg: RunConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW, weight decay on matrices (>= 2-D) only, fused on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.train.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    extra = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=cfg.train.lr, betas=(0.9, 0.95), eps=1e-8, **extra)
