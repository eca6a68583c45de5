"""A resume loads what it checked at no more host memory than the tensors' files' size (trainer/checkpoint/save.py
load_carrying, checkpoint_load.for_loading, trainer/checkpoint/held_tensors.py).

ef0bd47 made the load read each file whole into bytes as it hashed them (model and optimizer held at once) and then
made tensors from those bytes with safetensors.torch.load, a copy: at its peak a rank held the tensors' files twice
(scripts/resume_load_cost.py measures it). Now each file is read into one buffer as it is hashed, its header parsed by
the one parser, and the tensors are views of that buffer: one copy, the tensors themselves. A tensor the buffer holds
unaligned is copied out; a header the hash vouches for is still untrusted.
"""
from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load

from minilmd import checkpoint as ck
from minilmd.safetensors_scan import in_memory
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.checkpoint.held_tensors import tensors_of
from weights_helpers import save_checkpoint, tiny_model

torch.set_num_threads(1)


def rehash(ckpt: Path, name: str) -> None:
    """The manifest made to agree with `name` as it now is: every size and sha256 check passes."""
    manifest = json.loads((ckpt / ck.MANIFEST).read_text())
    data = (ckpt / name).read_bytes()
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / ck.MANIFEST).write_text(json.dumps(manifest))


def _within(t: torch.Tensor, data: bytearray) -> bool:
    start = torch.frombuffer(data, dtype=torch.uint8).data_ptr()
    return start <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= start + len(data)


def _safetensors(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytearray:
    """A safetensors file of raw tensors {name: (dtype, shape, bytes)}, in that order, its header padded to 8."""
    header, at = {}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return bytearray(struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, raw in tensors.values()))


def test_a_checkpoints_tensors_are_views_of_the_bytes_hashed_equal_to_safetensors_own_load(tmp_path):
    ckpt = save_checkpoint(tmp_path / "ckpt", tiny_model(seed=2), step=2)
    for name in (ck.MODEL_FILE, ck.OPTIMIZER_FILE):
        data = bytearray((ckpt / name).read_bytes())
        tensors, expected = tensors_of(in_memory(data, name)), load(bytes(data))
        assert tensors.keys() == expected.keys()
        for key, t in tensors.items():
            assert t.dtype == expected[key].dtype and torch.equal(t, expected[key]), key
            assert _within(t, data), f"{key} was copied"


def test_an_unaligned_tensor_is_copied_out_right_the_aligned_ones_are_views():
    """Three bytes of U8, then an F32 at offset 3 of the data: a view there would be unaligned."""
    floats = torch.tensor([1.5, -2.0], dtype=torch.float32)
    data = _safetensors({"bytes": ("U8", [3], b"\x01\x02\x03"),
                         "floats": ("F32", [2], floats.numpy().tobytes()),
                         "halves": ("BF16", [1, 2], torch.tensor([[3.0, 4.0]], dtype=torch.bfloat16)
                                    .view(torch.uint8).numpy().tobytes()),
                         "empty": ("I64", [0, 4], b"")})
    tensors = tensors_of(in_memory(data, "mixed.safetensors"))
    assert torch.equal(tensors["floats"], floats) and tensors["floats"].data_ptr() % 4 == 0
    assert not _within(tensors["floats"], data)  # copied
    assert _within(tensors["bytes"], data) and tensors["bytes"].tolist() == [1, 2, 3]
    assert tensors["halves"].dtype == torch.bfloat16 and tensors["halves"].tolist() == [[3.0, 4.0]]
    assert tensors["empty"].shape == (0, 4) and tensors["empty"].dtype == torch.int64


def test_a_hostile_model_header_its_manifest_vouches_for_is_invalid_with_words(tmp_path):
    """A model.safetensors whose header claims more data than the file holds, rehashed into its manifest: refused by
    the one parser as CheckpointInvalid (safetensors.torch.load raised its own error before)."""
    ckpt = save_checkpoint(tmp_path / "ckpt", tiny_model(seed=3), step=1)
    (ckpt / ck.MODEL_FILE).write_bytes(bytes(_safetensors({"w": ("F32", [4], b"\0" * 12)})))
    rehash(ckpt, ck.MODEL_FILE)
    with pytest.raises(ck.CheckpointInvalid, match="model.safetensors: tensor 'w' has inconsistent offsets"):
        ckpt_io.load(ckpt)


PEAK = """
import sys, torch
from minilmd.trainer.checkpoint import save as ckpt_io
def status(field):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(field + ":"))
before = status("VmRSS")
loaded = ckpt_io.load(sys.argv[1])
print(status("VmHWM") - before)
"""


@pytest.mark.slow
def test_a_resumes_load_holds_the_tensors_files_once_not_twice(tmp_path):
    """The peak RSS of a fresh process's load of a 96 MB checkpoint (a 32 MB tensor and its AdamW state) above its
    RSS before: the tensors' files once (their bytes are the tensors), where ef0bd47's load held them twice."""
    weight = torch.nn.Parameter(torch.randn(8_000_000))
    optimizer = torch.optim.AdamW([weight], lr=1e-3)
    weight.grad = torch.randn_like(weight)
    optimizer.step()
    ckpt = ckpt_io.save(tmp_path / "ckpt", 1, {"weight": weight.detach()}, optimizer.state_dict(),
                        {"step": 1, "config": {"data": {"prepared": ""}}})
    files = sum((ckpt / name).stat().st_size for name in (ck.MODEL_FILE, ck.OPTIMIZER_FILE))
    del weight, optimizer
    out = subprocess.run([sys.executable, "-c", PEAK, str(ckpt)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    extra = int(out.stdout.split()[-1])
    assert extra < 1.4 * files, f"the load's peak was {extra / files:.2f}x the tensors' files ({files:,} bytes)"
