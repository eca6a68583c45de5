"""What the trainer tells the outside world: metrics.jsonl lines, the heartbeat, throughput and MFU.

metrics.jsonl gets one JSON object per line, each with a "kind":
  {"kind": "train", "step", "tokens_seen", "loss", "lr", "grad_norm", "tok_s", "step_time", "total_steps", "time"}
  (+ "mfu" and "peak_mem_gib" on CUDA), {"kind": "eval", "step", "val_loss", "time"},
  {"kind": "checkpoint", "step", "blocking_s", "path", "time"}.
"step" is the number of optimizer steps completed. The heartbeat file's body is that number too; it is
rewritten (temp file + rename, no fsync: it is a liveness signal, not data) after every step.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from minilmd.names import HEARTBEAT, METRICS

# Dense bf16 peak of one device, FLOP/s (tensor cores, no sparsity). Unknown devices get no MFU.
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 80GB HBM3": 989e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "A100": 312e12,
}


def peak_bf16_flops(device_name: str) -> float | None:
    """Peak bf16 FLOP/s from the table, matched on the device name torch reports; None if unknown."""
    for key, flops in PEAK_BF16_FLOPS.items():  # most specific keys first
        if key in device_name:
            return flops
    return None


def flops_per_token(n_params: int, n_layers: int, hidden_size: int, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward): 6 N for the matrices (N counts the tied lm_head once, which
    the output projection uses), plus 12 L d T for attention scores and values (PaLM appendix B)."""
    return 6.0 * n_params + 12.0 * n_layers * hidden_size * seq_len


class MetricsLog:
    """Appends lines to <run dir>/metrics.jsonl and refreshes <run dir>/heartbeat. Inactive on ranks != 0."""

    def __init__(self, run_dir: str | os.PathLike, active: bool = True):
        self.run_dir = Path(run_dir)
        self.active = active
        if active:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._end_torn_line()

    def _end_torn_line(self) -> None:
        """Every attempt appends (a resume never truncates the curve); one killed mid-line must not glue this
        attempt's first line to its torn last one."""
        try:
            with open(self.run_dir / METRICS, "rb+") as f:
                size = f.seek(0, os.SEEK_END)
                if size:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        f.write(b"\n")
        except FileNotFoundError:
            pass

    def write(self, kind: str, **fields) -> None:
        if not self.active:
            return
        line = json.dumps({"kind": kind, **fields, "time": round(time.time(), 3)})
        with open(self.run_dir / METRICS, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def heartbeat(self, step: int) -> None:
        if not self.active:
            return
        path = self.run_dir / HEARTBEAT
        tmp = path.with_name(f".{HEARTBEAT}.{os.getpid()}.tmp")
        tmp.write_text(f"{step}\n", encoding="utf-8")
        os.replace(tmp, path)


class Throughput:
    """Real tokens per second and step time over the interval since the last report."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.tokens = 0
        self.steps = 0

    def add(self, real_tokens: int) -> None:
        self.tokens += real_tokens
        self.steps += 1

    def report(self) -> tuple[float, float]:
        """(tokens/s, seconds per step) since the last reset, then reset."""
        dt = max(time.perf_counter() - self.t0, 1e-9)
        tok_s, step_time = self.tokens / dt, dt / max(self.steps, 1)
        self.reset()
        return tok_s, step_time
