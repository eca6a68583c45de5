"""A loader's validation reads a model or optimizer file whole only once its header fits the shapes the checkpoint's
config needs (checkpoint._verify_files, safetensors_scan.scan_safetensors check_header).

Before, a resume's rank 0 (checkpoint_load.validated_for_loading) made a buffer of the size a manifest lists before the
file's header was looked at: a huge (or sparse) model.safetensors that a manifest lists at its size (a local
run.remote others can write, a corrupt manifest) was allocated whole first, a MemoryError (no CheckpointInvalid: the
resume crashed) or a node out of memory. A fake around the whole read records what it was asked for: nothing of
the model file, which is refused as CheckpointInvalid from its size or its header alone.
"""
from __future__ import annotations

import json
import os
import struct

import pytest

from minilmd import checkpoint as ck
from minilmd import checkpoint_load as ckl
from minilmd import safetensors_scan
from weights_helpers import save_checkpoint, tiny_model


@pytest.fixture
def whole_reads(monkeypatch) -> list[tuple[str, int]]:
    """(file name, size) of each file read whole; a model file is never really read so (the fake refuses it)."""
    asked: list[tuple[str, int]] = []
    real = safetensors_scan._read_whole

    def recorded(f, size, path, writable=False):
        asked.append((path.name, size))
        if path.name == ck.MODEL_FILE:
            raise AssertionError(f"{path.name} read whole ({size} bytes)")
        return real(f, size, path, writable)

    monkeypatch.setattr(safetensors_scan, "_read_whole", recorded)
    return asked


def _put_model(ckpt, header: dict, size: int) -> None:
    """model.safetensors replaced by `header` and zeros (sparse) to `size`, the manifest listing that size."""
    raw = json.dumps(header).encode()
    model = ckpt / ck.MODEL_FILE
    model.unlink()
    with open(model, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
    os.truncate(model, size)
    manifest = json.loads((ckpt / ck.MANIFEST).read_text())
    manifest["files"][ck.MODEL_FILE] = {"size": size, "sha256": "0" * 64}
    (ckpt / ck.MANIFEST).write_text(json.dumps(manifest))


def _one_tensor(size: int) -> dict:
    """A header of one U8 tensor that tiles a file of `size` bytes exactly: a well-formed file of other shapes."""
    data = size - 8
    while True:
        header = {"x": {"dtype": "U8", "shape": [data], "data_offsets": [0, data]}}
        if 8 + len(json.dumps(header).encode()) + data == size:
            return header
        data = size - 8 - len(json.dumps(header).encode())


def test_a_huge_sparse_model_listed_at_its_size_is_refused_unread(tmp_path, whole_reads):
    ckpt = save_checkpoint(tmp_path / "ckpts", tiny_model(seed=1), step=1)
    huge = 64 << 30
    _put_model(ckpt, _one_tensor(huge), huge)
    with pytest.raises(ck.CheckpointInvalid, match="model.safetensors: listed as .*more than its shapes need"):
        ckl.validated_for_loading(ckpt, None, {})
    assert ck.MODEL_FILE not in dict(whole_reads)


def test_a_model_of_other_shapes_is_refused_from_its_header_before_it_is_read_whole(tmp_path, whole_reads):
    ckpt = save_checkpoint(tmp_path / "ckpts", tiny_model(seed=1), step=1)
    size = (ckpt / ck.MODEL_FILE).stat().st_size
    _put_model(ckpt, _one_tensor(size), size)
    with pytest.raises(ck.CheckpointInvalid, match="model.safetensors: unexpected tensor x"):
        ckl.validated_for_loading(ckpt, None, {})
    assert ck.MODEL_FILE not in dict(whole_reads)
    with pytest.raises(ck.CheckpointInvalid, match="model.safetensors: unexpected tensor x"):
        ck.validated_weights(ckpt)  # an export's, sample's or chat's loading likewise


def test_a_good_checkpoint_is_still_read_whole_once(tmp_path, whole_reads, monkeypatch):
    ckpt = save_checkpoint(tmp_path / "ckpts", tiny_model(seed=1), step=1)
    monkeypatch.setattr(safetensors_scan, "_read_whole", lambda *a: whole_reads.append((a[2].name, a[1])) or
                        bytearray((ckpt / a[2].name).read_bytes()))
    parts = ckl.validated_for_loading(ckpt, None, {})
    assert parts.state["step"] == 1
    assert sorted(name for name, _ in whole_reads) == [ck.MODEL_FILE, ck.OPTIMIZER_FILE]


def test_a_carried_reference_is_kept_as_read_once_not_copied(tmp_path, monkeypatch):
    """A DPO run's reference sums are read into bytes as hashed and handed on as they are: only the model's and
    optimizer's buffers are writable (tensors are made over those). Before: a bytearray, then copied by bytes()."""
    import hashlib

    import torch
    from safetensors.torch import save_file

    from minilmd.names import DPO_REFERENCE

    ckpt = save_checkpoint(tmp_path / "ckpts", tiny_model(seed=1), step=1)
    save_file({"sums": torch.zeros(4)}, str(ckpt / DPO_REFERENCE))
    data = (ckpt / DPO_REFERENCE).read_bytes()
    manifest = json.loads((ckpt / ck.MANIFEST).read_text())
    manifest["files"][DPO_REFERENCE] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / ck.MANIFEST).write_text(json.dumps(manifest))
    writable: dict[str, bool] = {}
    real = safetensors_scan._read_whole

    def recorded(f, size, path, writable_=False):
        writable[path.name] = writable_
        return real(f, size, path, writable_)

    monkeypatch.setattr(safetensors_scan, "_read_whole", recorded)
    parts = ckl.validated_for_loading(ckpt, None, {DPO_REFERENCE: 1 << 20})
    assert parts.carried[DPO_REFERENCE] == data
    assert writable == {ck.MODEL_FILE: True, ck.OPTIMIZER_FILE: True, DPO_REFERENCE: False}
