"""scripts/gpu-check --dry-run's stand-ins for a GPU machine: CUDA faked in a part's process, and the fake NVML
library of tests/fakes_nvml.py under the real pynvml where the machine has no NVML."""
from __future__ import annotations

import sys
from pathlib import Path

FAKE_DEVICE = "NVIDIA H200"


def fake_cuda() -> None:
    """The dry run's CUDA: the names a part calls on a GPU answer as on one H200, with the tensors on the CPU
    (`p["tensors"]`). Only this part's process is patched; the minilmd commands it starts run on the CPU."""
    import torch

    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.get_device_name = lambda device=None: FAKE_DEVICE
    cuda.synchronize = lambda device=None: None
    cuda.max_memory_allocated = lambda device=None: 0
    cuda.reset_peak_memory_stats = lambda device=None: None
    torch.version.cuda = torch.version.cuda or "(faked)"


HOLD_CPU = """
import time
print("holding", flush=True)
time.sleep(120)
"""
"""The dry run's foreign process: the fake NVML lists it with 1 GiB."""


FAKE_NVML: list = []
"""The installed fake NVML library of the dry run, kept for the life of the part's process."""


def fake_nvml(reason: str):
    """The dry run without NVML: tests/fakes_nvml.py's fake library under the real pynvml (an idle H200 and an H200
    in MIG mode with two instances), and the FakeNvml that scripts it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fakes_nvml import FakeNvml, FakeNvmlLib, busy, mig  # noqa: I001 - from tests/, after the path

    from minilmd.daemon.host.nvml import PynvmlBackend

    script = FakeNvml([[busy(used_mib=7)], [busy(instances=[mig(used_mib=3), mig(used_mib=3)])]],
                      names=["NVIDIA H200", "NVIDIA H200"])
    FAKE_NVML.append(FakeNvmlLib(script).installed())  # held (a dropped one would restore the real library)
    return script, PynvmlBackend(FAKE_NVML[-1].__enter__()), busy
