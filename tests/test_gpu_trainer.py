"""The trainer's CUDA paths, checked on CPU: which exceptions are a CUDA OOM (and exit 76 from the real run()),
RNG states across a change of the visible device count (fakes for torch.cuda), the MFU peak table, compile's
"auto" default and its "compiling" heartbeat, the throttled heartbeat, and a save's blocking_s that includes the
wait for the previous write (a fake clock and a fake writer)."""
from __future__ import annotations

import base64
import json
import threading

import pytest
import torch
import torch.distributed

from minilmd import metrics
from minilmd.config import ConfigError, load_config
from minilmd.cuda_oom import cuda_oom_source
from minilmd.names import FAULT, HEARTBEAT
from minilmd.plan import mfu
from minilmd.protocol import EXIT_CUDA_OOM
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.loop import entry
from minilmd.trainer.loop import train as train_mod
from minilmd.trainer.loop.distributed import init_distributed
from trainer_corpus import write_config

NCCL_CALLOC = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system "
               "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclSystemError: System call "
               "(e.g. socket, malloc) or external library call failed or device error. \nLast error:\n"
               "Failed to CUDA calloc 6291456 bytes")
NCCL_SOCKET = ("NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled system error, NCCL version 2.21.5\n"
               "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device "
               "error. \nLast error:\nsocketStartConnect: Connect to 10.0.0.2<43771> failed : Connection refused")


def _chained() -> BaseException:
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("while running the backward pass") from inner
    except RuntimeError as outer:
        return outer


OOMS = [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.11 GiB total)"),
     "allocator"),
    (torch.AcceleratorError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
     "cuda"),
    (RuntimeError("CUDA error: out of memory\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."),
     "cuda"),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), "cublas"),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "cudnn"),
    (torch.distributed.DistBackendError(NCCL_CALLOC), "nccl"),
    (torch.distributed.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL "
                                        "version 2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\n"
                                        "Last error:\nCuda failure 2 'out of memory'"), "nccl"),
    (_chained(), "allocator"),
]
NOT_OOMS = [
    torch.distributed.DistBackendError(NCCL_SOCKET),  # a bare ncclSystemError: a socket, not memory
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: you tried to "
                 "allocate 1073741824 bytes."),  # the host, not the card
    RuntimeError("CUDA error: device-side assert triggered"),
    ValueError("CUDA out of memory"),  # only torch's RuntimeErrors
    KeyError("x"),
]


@pytest.mark.parametrize("exc,source", OOMS, ids=[s + str(i) for i, (_, s) in enumerate(OOMS)])
def test_every_shape_of_a_cuda_oom_is_classified_with_its_source(exc, source):
    assert cuda_oom_source(exc) == source


@pytest.mark.parametrize("exc", NOT_OOMS, ids=[type(e).__name__ + str(i) for i, e in enumerate(NOT_OOMS)])
def test_other_errors_are_not_a_cuda_oom(exc):
    assert cuda_oom_source(exc) is None


def _no_signal_handlers(monkeypatch):
    monkeypatch.setattr(entry.StopFlag, "install", lambda self: None)  # pytest keeps its own SIGINT handler


@pytest.mark.slow
def test_an_oom_at_context_creation_and_a_cublas_one_mid_run_exit_76_with_a_fault_note(tmp_path, corpus,
                                                                                    monkeypatch):
    _no_signal_handlers(monkeypatch)
    cfg = load_config(write_config(tmp_path, corpus, train={"max_steps": 4, "checkpoint_every": 100}))
    assert entry.settle_run_dir_of(cfg) is None  # main()'s, before run(): run.dir made, its real path

    def context_oom(cfg):
        raise torch.AcceleratorError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported")

    monkeypatch.setattr(entry, "init_distributed", context_oom)
    assert entry.run(cfg) == EXIT_CUDA_OOM
    fault = json.loads((cfg.run_dir / FAULT).read_text())
    assert fault["kind"] == "cuda_oom" and fault["source"] == "cuda" and fault["step"] == 0
    assert fault["message"] == "CUDA error: out of memory"

    monkeypatch.undo()
    _no_signal_handlers(monkeypatch)
    real_step = train_mod.Trainer.train_step

    def cublas_at_step_2(self):
        if self.step == 2:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
        return real_step(self)

    monkeypatch.setattr(train_mod.Trainer, "train_step", cublas_at_step_2)
    assert entry.run(cfg) == EXIT_CUDA_OOM
    fault = json.loads((cfg.run_dir / FAULT).read_text())
    assert (fault["source"], fault["step"], fault["micro_batch_size"]) == ("cublas", 2, 4)


# --- RNG states across a change of the visible device count -----------------------------------------------------
class FakeCuda:
    """torch.cuda's RNG functions over `visible` fake devices, each state a distinct byte string."""

    def __init__(self, visible: int, tag: int = 0):
        self.states = {i: torch.full((16,), tag * 10 + i, dtype=torch.uint8) for i in range(visible)}
        self.visible = visible

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.visible)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [self.states[i] for i in range(self.visible)])
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set_rng_state)
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", None)  # the old call: it must not be used

    def set_rng_state(self, state, device="cuda"):
        index = int(device)
        if index >= self.visible:
            raise IndexError(f"device {index} of {self.visible}")
        self.states[index] = state.clone()


@pytest.mark.parametrize("saved,visible", [(2, 2), (2, 1), (1, 2)])
def test_cuda_rng_states_restore_what_exists_bit_exact_per_device(monkeypatch, saved, visible):
    writer = FakeCuda(saved, tag=1)
    writer.install(monkeypatch)
    captured = json.loads(json.dumps(ckpt_io.capture_rng()))  # through JSON, as trainer_state.json holds it
    assert len(captured["cuda"]) == saved

    reader = FakeCuda(visible, tag=2)
    reader.install(monkeypatch)
    said: list[str] = []
    ckpt_io.restore_rng(captured, log=said.append)
    for i in range(visible):
        want = writer.states[i] if i < saved else torch.full((16,), 20 + i, dtype=torch.uint8)  # else untouched
        assert torch.equal(reader.states[i], want), f"device {i}"
    assert bool(said) == (saved != visible)
    if said:
        assert f"{saved} device(s), {visible} visible now: restored {min(saved, visible)}" in said[0]


def test_cuda_rng_states_are_base64_of_the_exact_bytes(monkeypatch):
    FakeCuda(1, tag=3).install(monkeypatch)
    assert base64.b64decode(ckpt_io.capture_rng()["cuda"][0]) == bytes([30] * 16)


# --- MFU --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,key,bf16_tflops", [
    ("NVIDIA H100 80GB HBM3", "H100", 989),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756),
    ("NVIDIA H100 NVL", "H100 NVL", 835),
    ("NVIDIA H200", "H200", 989),
    ("NVIDIA H200 NVL", "H200 NVL", 835),
    ("NVIDIA H800", "H800", 989),
    ("NVIDIA H20", "H20", 148),
    ("NVIDIA L40S", "L40S", 362),
    ("NVIDIA B200", "B200", 2250),
    ("NVIDIA A100-SXM4-80GB", "A100", 312),
    ("NVIDIA A100 80GB PCIe", "A100", 312),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 165.2),
    ("NVIDIA GeForce RTX 3090", "RTX 3090", 71),
])
def test_device_names_match_their_own_entry_and_its_bf16_peak(name, key, bf16_tflops):
    assert mfu.match_device(name) == key
    assert mfu.peak_flops(name, "bf16") == pytest.approx(bf16_tflops * 1e12)


@pytest.mark.parametrize("name", ["NVIDIA H2000", "NVIDIA GeForce RTX 409", "Tesla V100-SXM2-16GB", "",
                                  "NVIDIA H10"])
def test_unknown_devices_get_no_peak_rather_than_a_neighbour(name):
    assert mfu.match_device(name) is None and mfu.peak_flops(name, "bf16") is None


def test_fp32_uses_the_fp32_peak_or_tf32_when_torch_allows_it():
    assert mfu.peak_flops("NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(67e12)
    assert mfu.peak_flops("NVIDIA H100 80GB HBM3", "fp32", tf32=True) == pytest.approx(494.5e12)
    assert mfu.peak_flops("NVIDIA A100-SXM4-40GB", "fp32") == pytest.approx(19.5e12)
    with pytest.raises(ValueError):
        mfu.peak_flops("NVIDIA H200", "fp16")
    for peak in mfu.PEAKS.values():  # a typo of a digit shows here: bf16 >= TF32 > half of plain FP32
        assert peak.bf16 >= peak.tf32 >= peak.fp32 / 2 > 0


def test_attention_counts_the_full_score_matrix_as_nanochat_and_torchtitan_do():
    n, layers, d, t = 63_900_000, 8, 768, 1024
    flops = mfu.flops_per_token(n, 0, layers, d, t)
    assert flops == 6 * n + 12 * layers * d * t  # not halved for the causal mask (minilmd/plan/mfu.py says why)
    assert mfu.mfu(1e6, flops, 989e12, devices=2) == pytest.approx(1e6 * flops / (2 * 989e12))


# --- train.compile --------------------------------------------------------------------------------------------
def test_compile_is_auto_by_default_and_accepts_only_auto_true_false(tmp_path, corpus):
    assert load_config(write_config(tmp_path, corpus)).train.compile == "auto"
    for value in (True, False, "auto"):
        assert load_config(write_config(tmp_path, corpus, train={"compile": value})).train.compile == value
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path, corpus, train={"compile": "yes", "lr": -1.0},
                                 restart={"compile_timeout": 0}))
    assert any('train.compile = \'yes\': must be "auto", true or false' in p for p in e.value.problems)
    assert any(p.startswith("train.lr = -1.0") for p in e.value.problems)  # all problems at once
    assert any(p.startswith("restart.compile_timeout = 0") for p in e.value.problems)
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert [train_mod.compile_enabled(v, cpu) for v in ("auto", True, False)] == [False, True, False]
    assert [train_mod.compile_enabled(v, cuda) for v in ("auto", True, False)] == [True, True, False]


def test_the_first_compiled_step_runs_under_a_compiling_heartbeat_and_later_ones_do_not(tmp_path, corpus,
                                                                                      monkeypatch):
    """torch.compile stands in for itself here: a wrapper that notes the heartbeat each time the model is called
    (a real compile on CPU takes minutes; `minilmd bench step` runs one)."""
    seen: list[str] = []

    def fake_compile(module, **kwargs):
        def call(*args, **kw):
            seen.append((cfg.run_dir / HEARTBEAT).read_text())
            return module(*args, **kw)
        call.no_sync = getattr(module, "no_sync", None)
        return call

    monkeypatch.setattr(torch, "compile", fake_compile)
    cfg = load_config(write_config(tmp_path, corpus, train={"max_steps": 3, "grad_accum": 2, "compile": True,
                                                            "checkpoint_every": 100}))
    trainer = train_mod.Trainer(cfg, init_distributed(cfg))
    assert trainer.compiled
    assert trainer.train() == 0
    assert seen[:2] == ["0/3 compiling\n"] * 2  # both micro-batches of the first step, of its 3
    assert all("compiling" not in body for body in seen[2:]) and len(seen) == 6
    assert (cfg.run_dir / HEARTBEAT).read_text() == "3 exiting\n"  # the exit's beat: forced, training is over; its step
    # a plain number, as a supervisor from before the total reads it (tests/test_heartbeat_upgrade.py)


# --- the heartbeat, about once a second ---------------------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def perf_counter(self) -> float:
        return self.t

    def time(self) -> float:
        return self.t


def test_the_heartbeat_is_throttled_to_once_a_second_unless_forced_or_its_phase_changes(tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(metrics, "time", clock)
    log = metrics.MetricsLog(tmp_path)
    body = lambda: (tmp_path / HEARTBEAT).read_text()
    assert log.heartbeat(1) and body() == "1\n"
    clock.t += 0.4
    assert not log.heartbeat(2) and body() == "1\n"
    clock.t += 0.4
    assert not log.heartbeat(3)
    clock.t += 0.3  # 1.1 s after the last one
    assert log.heartbeat(4) and body() == "4\n"
    assert log.heartbeat(4, force=True)  # a save, an evaluation, the exit
    assert log.heartbeat(4, phase="compiling") and body() == "4 compiling\n"
    assert log.heartbeat(5) and body() == "5\n"  # the phase changed back
    assert not metrics.MetricsLog(tmp_path, active=False).heartbeat(9, force=True) and body() == "5\n"
    assert metrics.heartbeat_interval(600.0) == 1.0 and metrics.heartbeat_interval(2.0) == 0.2
    quick = metrics.MetricsLog(tmp_path, heartbeat_interval=0.2)  # under hang_timeout = 2 s
    assert quick.heartbeat(6)
    clock.t += 0.25
    assert quick.heartbeat(7) and body() == "7\n"


# --- blocking_s: the whole stall, the wait for the previous write included ------------------------------------
class GatedClock(FakeClock):
    """A fake clock whose next read by the main thread, once armed, opens `gate` (after taking the time)."""

    def __init__(self):
        super().__init__()
        self.armed, self.gate = False, threading.Event()

    def perf_counter(self) -> float:
        value = self.t
        if self.armed and threading.current_thread() is threading.main_thread():
            self.armed = False
            self.gate.set()
        return value


def test_blocking_s_includes_the_wait_for_a_slow_previous_write(tmp_path, monkeypatch):
    clock = GatedClock()
    monkeypatch.setattr(ckpt_io, "time", clock)
    writes: list[int] = []

    def slow_save(root, step, *args, **kwargs):  # the fake writer: 30 "seconds" of disk per checkpoint
        if step == 1:
            assert clock.gate.wait(30), "the second save never started"
        clock.t += 30.0
        writes.append(step)
        return tmp_path / f"step-{step}"

    monkeypatch.setattr(ckpt_io, "save", slow_save)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    saver = ckpt_io.AsyncCheckpointer(tmp_path, keep=None)
    first = saver.save(1, model, opt, {"step": 1})  # its write runs in the thread, held until the next save
    assert first == 0.0 and saver.last_wait_s == 0.0
    clock.armed = True
    blocked = saver.save(2, model, opt, {"step": 2})  # the loop's next save comes before that write has ended
    saver.wait()
    assert writes == [1, 2]
    assert saver.last_wait_s == 30.0 and blocked >= 30.0
