"""A trainer command whose AdamW refuses its learning rate, as torch does for lr=nan; the real `minilmd train`
otherwise:

    MINILMD_TRAINER_CMD="python tests/refusing_optimizer.py"

It stands for any deterministic refusal by torch of a value that the config check cannot see (the check refuses
lr=nan itself, so the refusal is injected here). The supervisor appends `train CONFIG --set ...`.
"""
from __future__ import annotations

import runpy
import sys

import torch


class RefusingAdamW(torch.optim.AdamW):
    def __init__(self, params, lr=1e-3, **kwargs):
        raise ValueError(f"Invalid learning rate: {lr} (refused by {__file__})")


torch.optim.AdamW = RefusingAdamW  # type: ignore[misc]
sys.argv = ["minilmd", *sys.argv[1:]]
runpy.run_module("minilmd.cli", run_name="__main__")
