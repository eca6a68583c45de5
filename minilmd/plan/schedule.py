"""The learning-rate schedule: linear warmup, then cosine from lr down to lr * min_lr_ratio.

A pure function of the step, so that a resumed run uses exactly the rates an uninterrupted one would have.
"""
from __future__ import annotations

import math


def lr_at(step: int, total_steps: int, lr: float, min_lr_ratio: float, warmup_steps: int = 0) -> float:
    """Rate for optimizer step `step` (0-based) of a run of `total_steps`."""
    min_lr = lr * min_lr_ratio
    if warmup_steps and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / decay_steps, 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
