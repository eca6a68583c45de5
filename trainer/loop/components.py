"""The parts trainer/loop/train.py's Trainer builds from the config besides the model and the data: AdamW (without
torch's compiler, EagerAdamW), whether torch.compile runs, and the parameter split its FLOPs per token counts (the
budget: minilmd/plan/budget.py)."""
from __future__ import annotations

import inspect
from typing import Any

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


# torch.optim's own methods, without the wrappers that import torch._dynamo on their first call (below)
_ADD_PARAM_GROUP = inspect.unwrap(torch.optim.Optimizer.add_param_group)
_ZERO_GRAD = inspect.unwrap(torch.optim.Optimizer.zero_grad)
_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.state_dict)
_LOAD_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.load_state_dict)
_ADAMW_STEP = inspect.unwrap(torch.optim.AdamW.step)


class EagerAdamW(torch.optim.AdamW):
    """torch's AdamW, the same arithmetic and state (bit for bit), whose methods do not import torch's compiler.

    torch.optim wraps add_param_group (called by __init__), step, zero_grad, state_dict and load_state_dict so that
    torch.compile never traces into them; each wrapper imports torch._dynamo on its first call, which costs a trainer
    about as much CPU as importing torch itself (1.1 against 1.35 CPU-s measured on the 2-core test machine: sympy,
    torch.fx, FSDP) and memory for its whole life, at every start and restart. The trainer never calls its
    optimizer from compiled code (torch.compile takes the model and its objective: trainer/loop/objective.py), and
    outside compiled code those wrappers change nothing: this class calls the wrapped functions directly, and step
    under no_grad as torch's wrapper does for an optimizer that is not `differentiable`. torch.compile and DDP still
    import the compiler where a run uses them."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _LOAD_STATE_DICT(self, state_dict)

    @torch.no_grad()
    def step(self, closure=None):
        assert not self.defaults["differentiable"]  # torch's wrapper would keep the graph then: never asked for here
        return _ADAMW_STEP(self, closure)


def build_optimizer(model: torch.nn.Module, cfg: RunConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW (EagerAdamW), weight decay on matrices (>= 2-D) only, fused on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.train.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    extra = {"fused": True} if device.type == "cuda" else {}
    return EagerAdamW(groups, lr=cfg.train.lr, betas=(0.9, 0.95), eps=1e-8, **extra)
