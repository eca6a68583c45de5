"""Helpers for the tests of `[init] from` naming a MiniMind .pth (minilmd/init_source.py, daemon/jobs/initstage.py,
trainer/checkpoint/init_weights.py): a run config of a one-layer model whose init.from is a given path, and a .pth
holding a state dict of exactly that model."""
from __future__ import annotations

from pathlib import Path

import torch

from minilmd.config import RunConfig
from minilmd.model_shapes import expected_state_shapes
from trainer_corpus import ONE_LAYER_MODEL


def _config(source: Path) -> RunConfig:
    cfg = RunConfig(source="test")
    for key, value in {**ONE_LAYER_MODEL, "vocab_size": 64}.items():
        setattr(cfg.model, key, value)
    cfg.init.from_ = str(source)
    return cfg


def _pth(path: Path, cfg: RunConfig, fill: float = 0.5) -> Path:
    torch.save({k: torch.full(s, fill) for k, s in expected_state_shapes(cfg.model).items()}, path)
    return path


def swap_after_resolution(monkeypatch, swap) -> None:
    """swap() right after staging's resolution of init.from has returned (and judged what it found)."""
    from minilmd.daemon.jobs import initstage

    resolved = initstage._resolve

    def resolved_then_swapped(spec, checkpoint):
        source = resolved(spec, checkpoint)
        swap()
        return source

    monkeypatch.setattr(initstage, "_resolve", resolved_then_swapped)
