"""Staging init.from into scratch (daemon/jobs/initstage.py) reads another user's files as untrusted.

Reproduced on the code before: `stage_init` fingerprinted a .pth without the run's model (bounded only by
MAX_PTH_BYTES, 16 GiB, not by what a state dict of the run's model can be), and its `_copy` looked at each file with
os.stat (links followed) and then copied it with a plain open(): a link swapped in after the look was followed and
its target copied, a FIFO swapped in blocked the staging thread for ever. The swaps below are real files replaced on
disk between the look (stat or lstat of that path) and the open: another user's race, made certain.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from init_from_helpers import _config, _pth
from minilmd.daemon.jobs import initstage
from minilmd.daemon.jobs.staging import SourceInvalid, SourceUnreachable
from minilmd.model_shapes import pth_bound
from minilmd.names import MANIFEST
from waiting import without_blocking


def test_staging_bounds_a_pth_by_a_state_dict_of_the_runs_model_not_by_16_gib(tmp_path):
    cfg = _config(tmp_path / "theirs.pth")
    cfg.run.scratch = str(tmp_path / "scratch")
    with open(tmp_path / "theirs.pth", "wb") as f:
        f.truncate(pth_bound(cfg.model_dict()) + 1)  # sparse: one byte more than any .pth of this model
    with pytest.raises(SourceInvalid, match="more than a state dict of this run's model can be"):
        without_blocking(lambda: initstage.stage_inputs(cfg))
    assert not (tmp_path / "scratch" / initstage.INIT_DIR).exists()


def test_a_pth_of_the_runs_model_is_staged_with_its_size_and_hash(tmp_path):
    cfg = _config(tmp_path / "theirs.pth")
    cfg.run.scratch = str(tmp_path / "scratch")
    pth = _pth(tmp_path / "theirs.pth", cfg)
    staged = Path(initstage.stage_inputs(cfg)["init.staged"])
    record = json.loads((staged / initstage.INIT_RECORD).read_text())
    assert record["size"] == pth.stat().st_size
    assert record["sha256"] == hashlib.sha256(pth.read_bytes()).hexdigest()
    assert (staged / initstage.INIT_PTH).read_bytes() == pth.read_bytes()
    assert initstage.init_problems(staged) == []


def _checkpoint(d: Path, files: dict[str, bytes]) -> Path:
    d.mkdir(parents=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    listed = {n: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in files.items()}
    (d / MANIFEST).write_text(json.dumps({"step": 1, "files": listed}))
    return d


def _swapped_after_its_look(monkeypatch, target: Path, make) -> None:
    """The first stat or lstat of `target` (by its path, or by its name in a directory's descriptor) answered as
    it is, then `target` replaced by make(target): os.stat is what the code before looked with, os.lstat what
    untrusted.open_regular looks with."""
    done = []

    def looked(real):
        def look(path, *args, **kwargs):
            st = real(path, *args, **kwargs)
            named = os.fspath(path) == (target.name if kwargs.get("dir_fd") is not None else str(target))
            if not done and named:
                done.append(True)
                target.unlink()
                make(target)
            return st
        return look

    monkeypatch.setattr(os, "stat", looked(os.stat))
    monkeypatch.setattr(os, "lstat", looked(os.lstat))


def test_a_checkpoint_file_swapped_for_a_link_after_its_look_is_refused_not_followed(tmp_path, monkeypatch):
    ckpt = _checkpoint(tmp_path / "theirs" / "step-00000001", {"model.safetensors": b"w" * 100})
    decoy = tmp_path / "decoy"
    decoy.write_bytes(b"w" * 100)  # the same bytes: only the link gives it away
    _swapped_after_its_look(monkeypatch, ckpt / "model.safetensors", lambda p: p.symlink_to(decoy))
    with pytest.raises(SourceInvalid, match="model.safetensors is a symbolic link: not followed"):
        without_blocking(lambda: initstage.stage_init(str(ckpt), tmp_path / "scratch"))
    assert not (tmp_path / "scratch" / initstage.INIT_DIR).exists()


def test_a_checkpoint_file_swapped_for_a_fifo_after_its_look_never_blocks_the_staging(tmp_path, monkeypatch):
    ckpt = _checkpoint(tmp_path / "theirs" / "step-00000001", {"model.safetensors": b"w" * 100})
    _swapped_after_its_look(monkeypatch, ckpt / "model.safetensors", os.mkfifo)
    # what was looked at is not what is opened: it changed under the read, read again later (waited for)
    with pytest.raises(SourceUnreachable, match="replaced while being opened"):
        without_blocking(lambda: initstage.stage_init(str(ckpt), tmp_path / "scratch"), ckpt / "model.safetensors")


def test_a_checkpoint_file_of_another_size_than_listed_is_not_copied_and_read_again_later(tmp_path):
    ckpt = _checkpoint(tmp_path / "theirs" / "step-00000001", {"model.safetensors": b"w" * 100})
    (ckpt / "model.safetensors").write_bytes(b"w" * (initstage.CHUNK + 1))  # written to since its manifest
    with pytest.raises(SourceUnreachable, match="listed as 100"):
        without_blocking(lambda: initstage.stage_init(str(ckpt), tmp_path / "scratch"))
    (ckpt / "model.safetensors").write_bytes(b"w" * 100)
    staged = initstage.stage_init(str(ckpt), tmp_path / "scratch")
    assert initstage.init_problems(staged) == []


def test_a_missing_checkpoint_file_is_waited_for_a_fifo_listed_is_final(tmp_path):
    ckpt = _checkpoint(tmp_path / "theirs" / "step-00000001", {"model.safetensors": b"w" * 100, "other": b""})
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(SourceUnreachable, match="missing"):
        initstage.stage_init(str(ckpt), tmp_path / "scratch")
    (ckpt / "model.safetensors").write_bytes(b"w" * 100)
    (ckpt / "other").unlink()
    os.mkfifo(ckpt / "other")
    with pytest.raises(SourceInvalid, match=f"{ckpt}: other is a FIFO: not read"):
        without_blocking(lambda: initstage.stage_init(str(ckpt), tmp_path / "scratch"), ckpt / "other")


def test_a_manifest_naming_a_file_below_the_checkpoint_is_refused_as_the_format_refuses_it(tmp_path):
    """init.from's manifest is checked by the checkpoint format's own rule (minilmd/checkpoint.py): a listed name
    is a plain file of the checkpoint directory. Staging's own weaker rule took "sub/model.safetensors" (a path:
    a directory of another user's below the checkpoint, copied into scratch), and an entry without a size."""
    ckpt = _checkpoint(tmp_path / "theirs" / "step-00000001", {"model.safetensors": b"w" * 100})
    (ckpt / "sub").mkdir()
    (ckpt / "sub" / "model.safetensors").write_bytes(b"w" * 10)
    listed = {"model.safetensors": {"size": 100, "sha256": hashlib.sha256(b"w" * 100).hexdigest()},
              "sub/model.safetensors": {"size": 10, "sha256": hashlib.sha256(b"w" * 10).hexdigest()}}
    (ckpt / MANIFEST).write_text(json.dumps({"step": 1, "files": listed}))
    with pytest.raises(SourceInvalid, match="bad entry for 'sub/model.safetensors'"):
        initstage.stage_init(str(ckpt), tmp_path / "scratch")
    assert not (tmp_path / "scratch" / initstage.INIT_DIR).exists()
