"""A resume reads and hashes each file of the checkpoint it takes once (issue 41: back to training within a minute).

Before, the trainer's resume (trainer/loop/resume.py) validated the newest checkpoint (find_latest: every file read,
hashed and scanned) and then loaded it (checkpoint.for_loading: every file read and hashed again, and checked against
the manifest a second time), so each of its files was opened, read and hashed twice. That second read closed any
window (a file swapped after validation was refused, not loaded); now the one read both validates and is what is
loaded (checkpoint_load.validated_for_loading), so a file swapped after its hash is never read at all.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from minilmd import checkpoint as ck
from minilmd import checkpoint_load as ckl
from minilmd.config import RunConfig
from minilmd.trainer.loop.distributed import Dist
from minilmd.trainer.loop.resume import resume
from open_counts import each_once, opens  # noqa: F401 - opens: a fixture
from weights_helpers import save_checkpoint, tiny_model

torch.set_num_threads(1)
ONE_RANK = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.fixture
def cfg(tmp_path) -> RunConfig:
    """A run whose scratch is tmp_path/scratch and that has no run.remote: its one root is its scratch's."""
    cfg = RunConfig()
    cfg.run.scratch, cfg.run.remote = str(tmp_path / "scratch"), ""
    return cfg


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load((ckpt / ck.MODEL_FILE).read_bytes())


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_opens_each_file_of_its_checkpoint_once_and_loads_it(cfg, opens):
    ckpt = save_checkpoint(cfg.checkpoint_dir, tiny_model(seed=1), step=1)
    expected = _weights(ckpt)
    opens.clear()
    found = resume(cfg, ONE_RANK, None)  # type: ignore[arg-type]  (None: the checkpoint's own config)
    assert found is not None and found.path == ckpt and found.state["step"] == 1
    each_once(opens, ckpt)
    assert _same(found.model_state, expected)
    assert found.optimizer_state["state"] and found.optimizer_state["param_groups"]


def test_a_model_swapped_once_hashed_is_not_what_the_resume_loads(cfg, monkeypatch):
    """model.safetensors replaced by another model's (same size, its manifest left as it was) the moment validation
    has hashed it: the resume loads the bytes it hashed, never the file put in its place (before: that file was read
    again and refused, the resume failing, CheckpointInvalid)."""
    ckpt = save_checkpoint(cfg.checkpoint_dir, tiny_model(seed=1), step=1)
    other = save_checkpoint(cfg.scratch_dir / "other", tiny_model(seed=2), step=1)
    verified, swapped = _weights(ckpt), (other / ck.MODEL_FILE).read_bytes()
    assert len(swapped) == (ckpt / ck.MODEL_FILE).stat().st_size and not _same(verified, _weights(other))
    real = ck.table_problems

    def hashed_then_swapped(table, size_of, sha256_of=None, *args, **kwargs):
        def sha256_then_swap(name):
            digest = sha256_of(name)
            if name == ck.MODEL_FILE:
                (ckpt / ".swap").write_bytes(swapped)
                os.replace(ckpt / ".swap", ckpt / name)
            return digest

        return real(table, size_of, sha256_then_swap if sha256_of else None, *args, **kwargs)

    monkeypatch.setattr(ck, "table_problems", hashed_then_swapped)
    found = resume(cfg, ONE_RANK, None)  # type: ignore[arg-type]
    assert found is not None and found.path == ckpt
    assert _same(found.model_state, verified)
    assert (ckpt / ck.MODEL_FILE).read_bytes() == swapped  # the swap happened: it was not read


def test_a_damaged_newest_step_is_set_aside_and_the_older_one_resumed(cfg):
    """The choice of the step is find_latest's, as before: a damaged newest (one byte of its weights changed, its
    size kept) is quarantined, never loaded, and the valid older one is what the resume loads."""
    older = save_checkpoint(cfg.checkpoint_dir, tiny_model(seed=1), step=1)
    newest = save_checkpoint(cfg.checkpoint_dir, tiny_model(seed=2), step=2)
    data = bytearray((newest / ck.MODEL_FILE).read_bytes())
    data[-1] ^= 0x01
    (newest / ck.MODEL_FILE).write_bytes(bytes(data))
    found = resume(cfg, ONE_RANK, None)  # type: ignore[arg-type]
    assert found is not None and found.path == older and found.state["step"] == 1
    assert _same(found.model_state, _weights(older))
    assert not newest.exists() and any((cfg.checkpoint_dir / "quarantine").iterdir())


def test_a_carried_file_is_kept_as_hashed_and_one_over_its_bound_is_refused_unread(tmp_path, opens):
    ckpt = save_checkpoint(tmp_path / "ckpts", tiny_model(seed=1), step=1)
    (ckpt / "extra.bin").write_bytes(b"carried")
    manifest = json.loads((ckpt / ck.MANIFEST).read_text())
    import hashlib
    manifest["files"]["extra.bin"] = {"size": 7, "sha256": hashlib.sha256(b"carried").hexdigest()}
    (ckpt / ck.MANIFEST).write_text(json.dumps(manifest))
    parts = ckl.validated_for_loading(ckpt, None, {"extra.bin": 64, "absent": 64})
    assert parts.carried == {"extra.bin": b"carried"} and parts.state["step"] == 1
    opens.clear()
    with pytest.raises(ck.CheckpointInvalid, match="cannot read extra.bin: over 6 bytes"):
        ckl.validated_for_loading(ckpt, None, {"extra.bin": 6})
    assert opens[str(ckpt.absolute() / "extra.bin")] == 0
