"""train.deterministic: bit-exact runs on the GPU, not only on the CPU.

Two undisturbed 20-step runs of one config on an H200 differed by 4.0e-3 in their final weights with torch's default
kernels (issue 41): cuBLAS picks its reduction split by the workspace it finds, atomics order sums differently every
run, and cuDNN attention's backward "defaults to a non-deterministic algorithm". With train.deterministic (the
default) the trainer, in every rank:
  * sets CUBLAS_WORKSPACE_CONFIG=:4096:8 in its environment before CUDA starts (cuBLAS reads it when its first
    handle is made; torch refuses a cuBLAS call in deterministic mode without it). The supervisor puts it in the
    launch environment too (`launch_env`), so torchrun and every worker inherit it; a trainer run on its own sets it
    at its entry (`prepare_environment`, before any CUDA call);
  * on CUDA, turns on torch.use_deterministic_algorithms with warn_only=False: the measurement found the cuDNN
    attention backward the only op that warned, and model.attention never takes a non-deterministic backend then
    (trainer/model/attention_choice.py), so an op without a deterministic kernel that a later torch or model brings
    is a loud error at the first step (`refusal`), never a run that silently stops being reproducible;
  * keeps torch.compile (inductor reads the deterministic flag when it traces; a compiled run's bit-exactness is
    not measured on a GPU yet: docs/training.md, "Bit-exact on the GPU").
On the CPU nothing is changed: it is bit-exact already, and deterministic mode could only pick other kernels.
The setting is recorded in every checkpoint (its config); a resume with the other one is refused
(minilmd/checkpoint.py, Expectation.deterministic).
"""
from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

from minilmd.config import ConfigError, RunConfig
from minilmd.names import CUBLAS_WORKSPACE_ENV, CUBLAS_WORKSPACE_VALUES, determinism_env


def prepare_environment(cfg: RunConfig, environ: MutableMapping[str, str] | None = None) -> str:
    """Before CUDA is initialised: the cuBLAS workspace a deterministic run needs (unless the environment already
    holds one torch accepts). Returns what was done, for the log."""
    env = os.environ if environ is None else environ
    if not cfg.train.deterministic:
        return "train.deterministic = false: torch's default kernels (not bit-reproducible on the GPU)"
    cuda_started = "torch" in sys.modules and _cuda_initialized()
    if env.get(CUBLAS_WORKSPACE_ENV) in CUBLAS_WORKSPACE_VALUES:
        return f"{CUBLAS_WORKSPACE_ENV}={env[CUBLAS_WORKSPACE_ENV]} (from the environment)"
    env.update(determinism_env(True))
    if cuda_started:  # cuBLAS may have read the old value already: the first deterministic cuBLAS call says so
        return f"{CUBLAS_WORKSPACE_ENV}={env[CUBLAS_WORKSPACE_ENV]} set AFTER CUDA started (too late for cuBLAS)"
    return f"{CUBLAS_WORKSPACE_ENV}={env[CUBLAS_WORKSPACE_ENV]} set before CUDA started"


def _cuda_initialized() -> bool:
    import torch

    return bool(torch.cuda.is_initialized())


def apply(cfg: RunConfig, device_type: str) -> bool:
    """Deterministic algorithms on, when the run asks for them and runs on CUDA. Returns whether they are on."""
    if not cfg.train.deterministic or device_type != "cuda":
        return False
    import torch

    torch.use_deterministic_algorithms(True, warn_only=False)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False  # autotuning picks by timing: another kernel on another run
    return True


def refusal(error: BaseException, cfg: RunConfig) -> ConfigError | None:
    """A ConfigError for torch's refusal of an op without a deterministic kernel (final: it comes again at every
    restart), or None when `error` is not that."""
    text = str(error)
    if not isinstance(error, RuntimeError) or "deterministic" not in text or "use_deterministic_algorithms" not in text:
        return None
    first = text.strip().splitlines()[0][:400]
    return ConfigError([f"train.deterministic = true, and torch has no deterministic kernel for an op of this run: "
                        f"{first}. Set train.deterministic = false to train with torch's default kernels (not "
                        f"bit-reproducible on the GPU)"], cfg.source)
