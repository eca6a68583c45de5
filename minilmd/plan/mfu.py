"""Model FLOPs utilisation: the FLOPs a training token costs, and the peak of the device for the dtype in use.

The convention (docs/training.md, "MFU"): MFU = tokens/s x FLOPs per token / (peak x devices), where
- FLOPs per token = 6 N_trainable + 4 N_frozen + 12 L d T (`flops_per_token`):
  * a trainable weight matrix costs 2 per parameter forward, 2 for the input gradient and 2 for its weight gradient;
    a frozen one (a LoRA run's base) has no weight gradient: 2 forward + 2 input gradient. N counts the tied lm_head
    once (its matmul is the one that costs; the embedding lookup costs none);
  * attention scores and values: PaLM's 12 L d T (appendix B; d = heads x head_dim), over the full T x T matrix,
    NOT halved for causal attention. That is nanochat's convention (`estimate_flops`: 12 * l * h * q * t) and
    torchtitan's (`get_num_flop_per_token`: 6 N + 12 l h q t), and what torch.utils.flop_counter counts for SDPA,
    so an MFU from here compares with theirs. (Until 2026-12 minilmd halved it, because a causal kernel computes
    only the lower triangle: that figure was ~4 % lower at seq 1024 for MiniMind-3, and comparable with nothing.)
    A packed row's document mask is ignored alike: the FLOPs are the model's, not the kernel's;
- the peak is the dense (no 2:4 sparsity) tensor-core peak of the dtype the matrices actually run in: bf16 under
  bf16 autocast; for fp32, the TF32 tensor-core peak if torch lets matmuls use TF32, else the plain FP32 peak.
torch.cuda.get_device_name names are matched exactly on whole words after dropping "NVIDIA"/"GeForce", the
longest entry winning: "H100 NVL" is its own entry, never H100 SXM's, and "H20" never matches "H200".
An unknown device gets no MFU rather than a wrong one, and so does a MIG instance (CUDA names it "NVIDIA H200 MIG
1g.18gb": a slice with a fraction of the card's SMs, which the table does not have).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    """Dense peak FLOP/s of one device."""

    bf16: float
    tf32: float
    fp32: float


T = 1e12
# Sources (dense figures; NVIDIA's datasheets print the sparse ones, twice these, for the tensor-core dtypes):
# H100/H200 SXM and NVL, H800: NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100, "Technical
#   Specifications", SXM / NVL columns) and H200 datasheet (nvidia.com/en-us/data-center/h200): BF16 1,979 / 1,671
#   TFLOPS sparse, TF32 989 / 835 sparse, FP32 67 / 60. H800 is the export H100 with the same SXM/PCIe compute.
# H100 PCIe: same H100 datasheet, PCIe column (BF16 1,513 sparse, TF32 756 sparse, FP32 51).
# H20: NVIDIA HGX H20 product brief (BF16 148 TFLOPS dense, TF32 74, FP32 44).
# L40S: NVIDIA L40S datasheet (BF16 733 sparse / 362 dense, TF32 366 sparse / 183 dense, FP32 91.6).
# B200: NVIDIA HGX B200 spec (nvidia.com/en-us/data-center/hgx, per GPU: FP16/BF16 4.5 PFLOPS sparse,
#   TF32 2.2 PFLOPS sparse, FP32 75 TFLOPS).
# A100: NVIDIA A100 datasheet (BF16 312 dense, TF32 156 dense, FP32 19.5).
# RTX 4090: NVIDIA Ada GPU architecture whitepaper, appendix table (BF16 with FP32 accumulate 165.2 dense,
#   TF32 82.6 dense, FP32 82.6).
# RTX 3090: NVIDIA Ampere GA102 GPU architecture whitepaper, table 9 (BF16 with FP32 accumulate 71 dense,
#   TF32 35.6 dense, FP32 35.6).
PEAKS: dict[str, Peak] = {
    "H100": Peak(989 * T, 494.5 * T, 67 * T),        # SXM5; torch names it "NVIDIA H100 80GB HBM3"
    "H100 PCIe": Peak(756 * T, 378 * T, 51 * T),
    "H100 NVL": Peak(835 * T, 417.5 * T, 60 * T),
    "H200": Peak(989 * T, 494.5 * T, 67 * T),        # SXM
    "H200 NVL": Peak(835 * T, 417.5 * T, 60 * T),
    "H800": Peak(989 * T, 494.5 * T, 67 * T),        # SXM
    "H800 PCIe": Peak(756 * T, 378 * T, 51 * T),
    "H20": Peak(148 * T, 74 * T, 44 * T),
    "L40S": Peak(362 * T, 183 * T, 91.6 * T),
    "B200": Peak(2250 * T, 1100 * T, 75 * T),
    "A100": Peak(312 * T, 156 * T, 19.5 * T),        # SXM4 and PCIe alike ("NVIDIA A100-SXM4-80GB")
    "RTX 4090": Peak(165.2 * T, 82.6 * T, 82.6 * T),
    "RTX 3090": Peak(71 * T, 35.6 * T, 35.6 * T),
}


def _words(name: str) -> list[str]:
    """"NVIDIA GeForce RTX 4090" -> ["rtx", "4090"]; "NVIDIA A100-SXM4-80GB" -> ["a100", "sxm4", "80gb"]."""
    return [w for w in re.split(r"[\s\-_]+", name.lower()) if w and w not in ("nvidia", "geforce")]


def match_device(device_name: str) -> str | None:
    """The PEAKS entry for a device name: the longest entry whose words begin the name's words; None if none."""
    words = _words(device_name)
    if "mig" in words:  # "NVIDIA H200 MIG 1g.18gb": a slice of the card, whose peak is not the table's
        return None
    best: str | None = None
    for key in PEAKS:
        key_words = _words(key)
        if words[:len(key_words)] == key_words and (best is None or len(key_words) > len(_words(best))):
            best = key
    return best


def peak_flops(device_name: str, dtype: str, tf32: bool = False) -> float | None:
    """Dense peak FLOP/s of the device for the matmul dtype in use: "bf16", or "fp32" (TF32 tensor cores when
    `tf32`, i.e. torch.get_float32_matmul_precision() is not "highest"); None for an unknown device."""
    key = match_device(device_name)
    if key is None:
        return None
    peak = PEAKS[key]
    if dtype == "bf16":
        return peak.bf16
    if dtype == "fp32":
        return peak.tf32 if tf32 else peak.fp32
    raise ValueError(f"no peak for dtype {dtype!r} (bf16 or fp32)")


def flops_per_token(n_trainable: int, n_frozen: int, n_layers: int, attention_dim: int, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward): 6 per trainable and 4 per frozen parameter, plus
    12 L d T for attention scores and values over the full T x T matrix (d = heads x head_dim; not halved for a
    causal mask, as nanochat and torchtitan count it: the module docstring)."""
    return 6.0 * n_trainable + 4.0 * n_frozen + 12.0 * n_layers * attention_dim * seq_len


def mfu(tok_s: float, flops_per_tok: float, peak: float, devices: int = 1) -> float:
    """Achieved FLOP/s over the peak of `devices` devices."""
    return tok_s * flops_per_tok / (peak * devices)
