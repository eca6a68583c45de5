"""The parts trainer/loop/train.py's Trainer builds from the config besides the model and the data: AdamW, whether
torch.compile runs, and the parameter split its FLOPs per token counts (the budget: minilmd/plan/budget.py)."""
from __future__ import annotations

import torch

from minilmd.config import RunConfig


def compile_enabled(setting: bool | str, device: torch.device) -> bool:
    """train.compile: true, false, or "auto": on CUDA, where eager mode is host-bound (docs/training.md), and not
    on CPU, where a cold compile costs minutes that a short CPU run never wins back."""
    return setting is True or (setting == "auto" and device.type == "cuda")


def parameter_split(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, frozen) parameters of a model, each counted once (a tied weight is one parameter): the N of
    minilmd/plan/mfu.py's FLOPs per token."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters()) - trainable


def build_optimizer(model: torch.nn.Module, cfg: RunConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW, weight decay on matrices (>= 2-D) only, fused on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.train.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    extra = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=cfg.train.lr, betas=(0.9, 0.95), eps=1e-8, **extra)
