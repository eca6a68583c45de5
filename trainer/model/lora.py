"""LoRA: a frozen base model with a trainable low-rank bypass on chosen Linear layers, PEFT's math and names.

Each target Linear W (out x in) of every block becomes a `LoraLinear`:

    y = W x + B(A(dropout(x))) * alpha / rank          A: (rank, in), kaiming-uniform(a=sqrt(5)); B: (out, rank), 0

exactly PEFT's `LoraLayer` (`init_lora_weights=True`, no rsLoRA, no DoRA), so that a freshly wrapped model computes
what the base computes (B = 0) and an adapter trained here loads into PEFT unchanged. The wrapper keeps the base
matrix under its old name (`...q_proj.weight`) and adds `...q_proj.lora_A.weight` and `...q_proj.lora_B.weight`:
the base keys of the state dict are the base checkpoint's, and the adapter keys are PEFT's once prefixed with
`base_model.model.` (export.py). Only the adapters have requires_grad; a LoRA run's checkpoints hold
`adapter_state_dict(model)` and nothing of the base (minilmd/model_shapes.py: expected_adapter_shapes).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minilmd.config import LoraSection
from minilmd.model_shapes import TARGET_MODULES, as_lora_section

ADAPTER_PARTS = (".lora_A.", ".lora_B.")


class LoraLinear(nn.Module):
    """A frozen Linear (no bias, as every MiniMind projection) plus the bypass B A scaled by alpha / rank."""

    weight: nn.Parameter
    lora_A: nn.Linear
    lora_B: nn.Linear
    lora_dropout: nn.Module
    scaling: float
    active: bool

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float):
        super().__init__()
        if base.bias is not None:
            raise ValueError("LoRA targets here are bias-free Linear layers")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.weight.requires_grad_(False)
        like = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(self.in_features, rank, bias=False, **like)
        self.lora_B = nn.Linear(rank, self.out_features, bias=False, **like)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling = alpha / rank
        self.active = True
        """False: the base alone (`minilmd sample --no-lora`, or set_active)."""
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # PEFT's reset_lora_parameters
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if not self.active:
            return y
        return y + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        """W + B A * alpha / rank: the one matrix that computes what this layer computes (dropout off)."""
        return self.weight + (self.lora_B.weight @ self.lora_A.weight) * self.scaling


def target_layers(model: Any, targets: list[str]) -> list[tuple[nn.Module, str]]:
    """(parent module, attribute) of every target Linear, block by block, in TARGET_MODULES order."""
    found = []
    for block in model.model.layers:
        for name in [t for t in TARGET_MODULES if t in targets]:
            found.append((getattr(block, TARGET_MODULES[name]), name))
    return found


def apply_lora(model: nn.Module, lora: LoraSection | dict) -> int:
    """Freeze every weight of `model` and wrap each target in a LoraLinear (adapters drawn from the current torch
    RNG, in module order). Returns the number of adapter parameters."""
    cfg = as_lora_section(lora)
    for p in model.parameters():
        p.requires_grad_(False)
    for parent, name in target_layers(model, cfg.targets):
        setattr(parent, name, LoraLinear(getattr(parent, name), cfg.rank, cfg.alpha, cfg.dropout))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def lora_layers(model: nn.Module) -> list[LoraLinear]:
    return [m for m in model.modules() if isinstance(m, LoraLinear)]


def is_adapter_key(key: str) -> bool:
    return any(part in key for part in ADAPTER_PARTS)


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors of a wrapped model, under minilmd's names: what a LoRA checkpoint holds."""
    return {k: v for k, v in model.state_dict().items() if is_adapter_key(k)}


def base_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The base weights of a wrapped model, under the base checkpoint's names."""
    return {k: v for k, v in model.state_dict().items() if not is_adapter_key(k)}


@torch.no_grad()
def load_adapter(model: nn.Module, adapter: dict[str, torch.Tensor]) -> None:
    """Copy adapter tensors into a wrapped model; the keys and shapes must be exactly the model's adapters."""
    own = adapter_state_dict(model)
    missing, extra = sorted(set(own) - set(adapter)), sorted(set(adapter) - set(own))
    wrong = sorted(k for k in set(own) & set(adapter) if own[k].shape != adapter[k].shape)
    if missing or extra or wrong:
        raise ValueError(f"the adapter does not fit this model's LoRA layers: missing {missing[:3]}, unexpected "
                         f"{extra[:3]}, other shapes {wrong[:3]}")
    for k, v in adapter.items():
        own[k].copy_(v)


def set_active(model: nn.Module, active: bool) -> None:
    """Switch every adapter on or off (off: the model computes exactly the base)."""
    for layer in lora_layers(model):
        layer.active = active


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of a wrapped model with every adapter folded in, under the base checkpoint's names."""
    merged = base_state_dict(model)
    for name, module in model.named_modules():
        if isinstance(module, LoraLinear):
            merged[f"{name}.weight"] = module.merged_weight().contiguous()
    return merged
