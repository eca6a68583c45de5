"""model.attention: which SDPA kernel the model's attention runs, chosen once per run and kept.

torch picks an SDPA backend by a fixed order, not by speed: on an H200 the model ran cuDNN attention (5.06 ms
forward+backward at GQA 8/4, head_dim 96, B=8, T=1024) where flash took 3.87 ms (issue 41, part 3 of
scripts/gpu-check); and cuDNN's backward is not deterministic. So with model.attention = "auto", at the run's first
start on CUDA, forward+backward of the model's own Attention module is timed at the run's micro-batch, seq_len and
dtype for each backend the device offers (`candidates`: the deterministic ones only with train.deterministic), and
the fastest is kept. A backend the device or the shape does not serve raises in torch and counts as not offered,
and so does one whose backward torch refuses in deterministic mode (the timing runs under it).
On the CPU "auto" is torch's own choice, untimed: CPU runs stay what they were, and a timing on a loaded CPU would
make two undisturbed runs choose differently. A forced value ("flash", ...) is checked to run here, not timed.

The choice is recorded in every checkpoint (trainer_state "kernels", `Choice.record`) and every later start of the
run keeps it: a resume must not change kernels (other kernels sum in another order; the run would no longer be
bit-identical to an undisturbed one). On a device of another type than the one recorded (a CPU run resumed on a
GPU) it is chosen again, saying so. A forced value other than the recorded one is refused before anything is loaded
(minilmd/checkpoint.py, Expectation.attention). The timer is an argument (`Timer`) so that the choice is tested
on the CPU with a fake one (tests/test_attention_choice.py); rank 0 chooses, every rank applies its choice.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from minilmd.config import ConfigError, RunConfig
from minilmd.config_values import ATTENTION_BACKENDS, NONDETERMINISTIC_ATTENTION

DEFAULT = "default"
"""Recorded for torch's own choice (the CPU's "auto"): no backend restricted."""

Timer = Callable[[str], "float | None"]
"""Seconds of one forward+backward of the model's attention with only that backend enabled; None when the device
does not offer it for this shape (torch raised)."""

_SDP_NAMES = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
              "math": "MATH"}
_FLAGS = {"flash": "enable_flash_sdp", "efficient": "enable_mem_efficient_sdp", "cudnn": "enable_cudnn_sdp",
          "math": "enable_math_sdp"}


@dataclass
class Choice:
    attention: str
    how: str
    """"measured", "forced", "default" (torch's own, on the CPU), or what was recorded when kept."""
    device_type: str
    device_name: str = ""
    timings_ms: dict[str, float | None] = field(default_factory=dict)

    def record(self, deterministic: bool) -> dict:
        """trainer_state's "kernels" (docs/formats.md)."""
        return {"attention": self.attention, "attention_how": self.how, "attention_ms": self.timings_ms,
                "device_type": self.device_type, "device_name": self.device_name, "deterministic": deterministic}


def candidates(deterministic: bool) -> list[str]:
    """The backends "auto" times: every one, less the non-deterministic ones when the run is deterministic."""
    return [b for b in ATTENTION_BACKENDS if not (deterministic and b in NONDETERMINISTIC_ATTENTION)]


def fastest(timer: Timer, names: list[str]) -> tuple[str, dict[str, float | None]]:
    """The backend of least time among those the timer says are offered, and every time in ms (None: not offered).
    A tie keeps the earlier name (ATTENTION_BACKENDS' order). Raises RuntimeError when none is offered."""
    times = {name: timer(name) for name in names}
    offered = {n: s for n, s in times.items() if s is not None}
    if not offered:
        raise RuntimeError(f"no SDPA backend of {names} runs this model's attention here")
    best = min(offered, key=lambda n: (offered[n], names.index(n)))
    return best, {n: None if s is None else round(s * 1000, 4) for n, s in times.items()}


def decide(cfg: RunConfig, device_type: str, device_name: str, recorded: dict | None, timer: Timer) -> Choice:
    """What this start runs: forced, kept from the checkpoint's record, measured (CUDA), or torch's own (CPU)."""
    setting = cfg.model.attention
    if setting != "auto":
        if timer(setting) is None:
            raise ConfigError([f"model.attention = {setting!r}: this device ({device_name or device_type}) does not "
                               f"run it for this model's attention (torch found no such kernel for the shape); use "
                               f"\"auto\" or another backend"], cfg.source)
        return Choice(setting, "forced", device_type, device_name)
    if recorded and recorded.get("device_type") == device_type and isinstance(recorded.get("attention"), str):
        kept = recorded["attention"]
        if kept == DEFAULT or timer(kept) is not None:
            return Choice(kept, str(recorded.get("attention_how", "kept")), device_type,
                          str(recorded.get("device_name", "")), dict(recorded.get("attention_ms") or {}))
    if device_type != "cuda":
        return Choice(DEFAULT, "default", device_type, device_name)
    best, timings = fastest(timer, candidates(cfg.train.deterministic))
    return Choice(best, "measured", device_type, device_name, timings)


def apply(choice: Choice, deterministic: bool) -> None:
    """Restrict SDPA to the chosen backend (and math, for the calls it cannot serve: a decoding step's mask), before
    the first forward (torch.compile reads the flags when it traces). DEFAULT leaves torch's order, less cuDNN when
    the run is deterministic."""
    if choice.attention == DEFAULT:
        if deterministic and choice.device_type == "cuda":
            torch.backends.cuda.enable_cudnn_sdp(False)
        return
    for name, flag in _FLAGS.items():
        getattr(torch.backends.cuda, flag)(name in (choice.attention, "math"))


def settle(cfg: RunConfig, dist: Any, bf16: bool, recorded: dict | None, timer: Timer | None = None) -> dict:
    """The hook the Trainer calls once the resume has read the checkpoint's "kernels" (`recorded`): rank 0 decides
    and broadcasts its choice, every rank applies it; returns the record for trainer_state. `dist`: the Trainer's
    Dist (device, is_main, active)."""
    device = dist.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    box: list = [None]
    if dist.is_main:
        box[0] = decide(cfg, device.type, name, recorded, timer or attention_timer(cfg, device, bf16))
    if dist.active:
        import torch.distributed as torch_dist

        torch_dist.broadcast_object_list(box, src=0)
    choice: Choice = box[0]
    apply(choice, cfg.train.deterministic)
    if dist.is_main and choice.attention != DEFAULT:  # torch's own choice on the CPU: nothing to say
        times = ", ".join(f"{n} {'-' if ms is None else f'{ms:.3f} ms'}" for n, ms in choice.timings_ms.items())
        print(f"minilmd: attention kernel {choice.attention} ({choice.how}{f': {times}' if times else ''})",
              flush=True)
    return choice.record(cfg.train.deterministic)


def attention_timer(cfg: RunConfig, device: torch.device, bf16: bool, repeats: int = 5) -> Timer:
    """The real Timer: the model's own Attention module at (micro_batch_size, seq_len, hidden) in the run's dtype,
    forward+backward, each backend forced alone (torch.nn.attention.sdpa_kernel); the median of `repeats` after two
    warm-up calls. The RNG states are forked: the run's draws stay what they would be without the timing."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from minilmd.trainer.model.minimind import Attention, rope_table

    def timer(name: str) -> float | None:
        t, m = cfg.train, cfg.model
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            attn = Attention(m).to(device)
            x = torch.randn(t.micro_batch_size, t.seq_len, m.hidden_size, device=device, requires_grad=True)
            cos, sin = rope_table(m.head_dim, t.seq_len, m.rope_theta, device=device)
            autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
            try:
                with sdpa_kernel([getattr(SDPBackend, _SDP_NAMES[name])]):
                    return _median_seconds(lambda: _fwd_bwd(attn, x, cos, sin, autocast), device, repeats)
            except torch.OutOfMemoryError:
                raise
            except RuntimeError:  # "No available kernel" and the like: not offered for this shape here
                return None
    return timer


def _fwd_bwd(attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, autocast) -> None:
    with autocast:
        y = attn(x, cos, sin)
    y.float().sum().backward()
    x.grad = None
    attn.zero_grad(set_to_none=True)


def _median_seconds(call: Callable[[], None], device: torch.device, repeats: int) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    for _ in range(2):
        call()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        call()
        sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
