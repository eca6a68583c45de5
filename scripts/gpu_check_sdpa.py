"""Part "3 attention" of scripts/gpu-check, second half: the SDPA backend chosen by measurement, not by torch's
default order. Each backend (flash, efficient, cudnn, math) is forced in turn (torch.nn.attention.sdpa_kernel) on
the model's own Attention layer, forward and backward at the check's shape; a backend that refuses the inputs (GQA,
dtype, head_dim, the device) is reported "unavailable", never a failure. On a GPU the times are device times
(synchronized); in the dry run the same code runs on the CPU, where only the timing, not its figures, is checked.
"""
from __future__ import annotations

import time
from typing import Any

BACKENDS = ("flash", "efficient", "cudnn", "math")


def time_backends(attn: Any, x: Any, cos: Any, sin: Any, device: str, dtype: Any, cuda: bool,
                  repeats: int) -> dict[str, float | None]:
    """Milliseconds per forward+backward of `attn` with each backend forced, None where it refuses."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kinds = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    sync = torch.cuda.synchronize if cuda and device != "cpu" else (lambda: None)

    def once() -> None:
        with torch.autocast(device, dtype=dtype, enabled=cuda):
            attn(x, cos, sin).float().sum().backward()

    times: dict[str, float | None] = {}
    for name in BACKENDS:
        try:
            with sdpa_kernel(kinds[name]):
                once()  # the first call picks kernels (and fails here when the backend refuses)
                sync()
                t0 = time.perf_counter()
                for _ in range(repeats):
                    once()
                sync()
            times[name] = 1000 * (time.perf_counter() - t0) / repeats
        except RuntimeError:  # "No available kernel", a dtype or shape the backend does not take
            times[name] = None
    return times


def describe(times: dict[str, float | None]) -> str:
    """"flash 1.20 ms, efficient -, cudnn 0.98 ms, math 4.10 ms: fastest cudnn" ("-": unavailable)."""
    timed = {k: v for k, v in times.items() if v is not None}
    parts = ", ".join(f"{k} {v:.2f} ms" if v is not None else f"{k} -" for k, v in times.items())
    return parts + (f": fastest {min(timed, key=lambda k: timed[k])}" if timed else ": no backend ran")
