"""What a bucketed run's shapes cost, paid at start: the widest micro-batch before the first step, a "compiling"
heartbeat before each step that brings a new width, and the CUDA allocator's setting.

In `data.mode = "bucketed"` micro-batches come in up to 32 widths (minilmd/corpus/analysis/stats.py width_class),
the widest at a random step, perhaps hours in. So, before the first optimizer step of every attempt (after the
resume), one forward+backward of micro_batch_size rows at the widest width class: a CUDA OOM then happens at start,
not after hours of work (a fresh optimizer, whose moments do not exist yet, has room held for them meanwhile). Its
gradients are dropped (None again, as after optimizer.zero_grad), no optimizer step is taken and the RNG states are
put back (LoRA dropout draws from them), so training and a resume stay bit-exact.

Under torch.compile the input's width is marked dynamic (step.mark_width_dynamic): one graph serves every width.
Measured on CPU (tests/test_bucketed_compile.py, dynamo's counters): 1 graph with the mark; without it, 2 (dynamo
compiles the first width static, then recompiles dynamic at the second width, outside any allowance). Each step
whose micro-batch widths are new to this process still runs under the "compiling" heartbeat
(restart.compile_timeout): on another torch or model a width may specialise the graph, and then it compiles once per
width class, never unannounced.
What these need is handed over as typed arguments (step.StepSetup, the sampler, the step), never the Trainer.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Protocol

import torch

from minilmd.plan.bucketing import BucketedSampler, PaddedSampler
from minilmd.plan.sampler_base import Sampler
from minilmd.trainer.loop import step as step_mod
from minilmd.trainer.loop.step import StepSetup

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"


class Heartbeat(Protocol):
    def __call__(self, step: int, phase: str = "", force: bool = False) -> object: ...


def cuda_alloc_conf(device_setting: str, environ: Mapping[str, str]) -> str | None:
    """The PYTORCH_CUDA_ALLOC_CONF the trainer sets, or None to leave it: expandable segments (memory freed by one
    width is reused by another instead of fragmenting the cache) unless the user set it (or torch's newer name,
    PYTORCH_ALLOC_CONF), or the run is on the CPU."""
    if device_setting == "cpu" or ALLOC_CONF in environ or "PYTORCH_ALLOC_CONF" in environ:
        return None
    return EXPANDABLE


def set_cuda_alloc_conf(device_setting: str) -> None:
    """Before CUDA is initialised: the allocator reads the variable once, at its first use."""
    value = cuda_alloc_conf(device_setting, os.environ)
    if value is not None:
        os.environ[ALLOC_CONF] = value


class WidthWatch:
    """The micro-batch widths this process has run: a step that brings a new one may compile."""

    def __init__(self, sampler: Sampler, compiled: bool, micro_batch_size: int, global_batch: int):
        self.sampler, self.compiled = sampler, compiled
        self.micro_batch_size, self.global_batch = micro_batch_size, global_batch
        self.seen: set[int] = set()

    def widths(self, first_row: int) -> set[int]:
        """The widths of the micro-batches of the step whose global batch starts at row `first_row`."""
        if isinstance(self.sampler, PaddedSampler):
            return self.sampler.micro_batch_widths(first_row, self.global_batch, self.micro_batch_size)
        return {self.sampler.seq_len}  # packed windows

    def new_at(self, first_row: int) -> bool:
        """Whether the step starting at row `first_row` runs a width this process has not run yet (it may compile,
        under torch.compile)."""
        if not self.compiled:
            return False
        widths = self.widths(first_row)
        new = not widths <= self.seen
        self.seen |= widths
        return new


def _adam_moments_room(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """A fresh AdamW creates its two moments per parameter at its first step: until then, room for them (left
    uninitialised, never read), so that the warm-up's peak is a later step's. None needed after a resume."""
    if optimizer.state:
        return []
    return [torch.empty_like(p) for group in optimizer.param_groups for p in group["params"] for _ in range(2)]


def compiles_first(compiled: bool, sampler: Sampler, step: int, total_steps: int) -> bool:
    """Whether widest_micro_batch runs under torch.compile: the process's first compile is then its (compile_s)."""
    return compiled and isinstance(sampler, BucketedSampler) and step < total_steps


def widest_micro_batch(setup: StepSetup, sampler: Sampler, watch: WidthWatch, heartbeat: Heartbeat, step: int,
                       total_steps: int) -> None:
    """Bucketed: one forward+backward at the widest width with the real micro-batch size, then the gradients
    dropped and the RNG states restored (module docstring). Other modes: nothing (every step is that wide).
    heartbeat(step, phase=..., force=...): the run's heartbeat, "compiling" over a first compile."""
    if not isinstance(sampler, BucketedSampler) or step >= total_steps:
        return
    if watch.compiled:  # the first compile of this process happens here
        watch.seen.add(sampler.widest())
        heartbeat(step, phase="compiling", force=True)
    batch = step_mod.to_device(sampler.widest_batch(setup.micro_batch_size), setup.dist.device, setup.dynamic_width)
    device = setup.dist.device
    devices = [device] if device.type == "cuda" else []
    moments = _adam_moments_room(setup.optimizer)
    with torch.random.fork_rng(devices=devices):
        with (setup.forward.no_sync() if setup.dist.active else nullcontext()), setup.autocast():
            loss, _ = step_mod.micro_batch_loss(setup.forward, batch)  # the training step's graph
        loss.backward()
    del loss, moments
    setup.model.zero_grad(set_to_none=True)  # None, as optimizer.zero_grad leaves them after every step
    heartbeat(step, force=True)
