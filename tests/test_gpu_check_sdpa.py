"""scripts/gpu_check_sdpa.py, the SDPA backends of gpu-check's part 3 forced and timed one by one: on the CPU the
math backend runs, the CUDA-only ones are reported unavailable (not a failure), and the fastest is named."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from minilmd.config import ModelSection
from minilmd.trainer.model.minimind import Attention, rope_table

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_each_backend_is_timed_or_reported_unavailable_on_the_cpu():
    sys.path.insert(0, str(SCRIPTS))  # beside gpu-check, not a package
    try:
        import gpu_check_sdpa as sdpa
    finally:
        sys.path.remove(str(SCRIPTS))
    cfg = ModelSection(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    attn = Attention(cfg)
    x = torch.randn(1, 16, 64, requires_grad=True)
    cos, sin = rope_table(cfg.head_dim, 16, cfg.rope_theta)
    times = sdpa.time_backends(attn, x, cos, sin, "cpu", torch.float32, cuda=False, repeats=1)
    assert list(times) == list(sdpa.BACKENDS)
    assert times["math"] is not None and times["math"] > 0
    assert times["efficient"] is None and times["cudnn"] is None  # CUDA kernels: refused on CPU tensors
    text = sdpa.describe(times)
    assert "efficient -" in text and "cudnn -" in text and ": fastest " in text
    assert sdpa.describe(dict.fromkeys(sdpa.BACKENDS)).endswith(": no backend ran")
