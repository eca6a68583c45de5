"""The strict validation (minilmd/checkpoint.py `validate`: init.from checkpoints, remote checkpoints, export inputs)
and the loaders after it never follow a link nor block on a FIFO.

Reproduced on the code before: the sizes were checked with os.stat (a link to a regular file of the listed size
and hash passed, as did a checkpoint directory that is a link), the files hashed with a plain open() (a FIFO swapped
in after its size was looked at blocked the hash for ever), and the weights then loaded with safetensors'
load_file of the path (a link swapped in after validation loaded another file's weights).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from minilmd import checkpoint as ck
from minilmd.config import ConfigError, RunConfig
from minilmd.model_shapes import as_model_section
from minilmd.trainer.model.export import read_checkpoint
from minilmd.trainer.model.export_paths import ExportError
from test_shared_places_attacks import without_blocking
from weights_helpers import CHECKPOINT_MODEL, make_run, save_run


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    """Two valid checkpoints of the same model with other weights: ours, and one elsewhere to link to."""
    root = tmp_path_factory.mktemp("ckpts")
    return save_run(root / "ours", 1, *make_run(1, seed=0)), save_run(root / "other", 1, *make_run(1, seed=1))


@pytest.fixture
def ours(checkpoints, tmp_path) -> Path:
    copy = tmp_path / "theirs" / checkpoints[0].name
    shutil.copytree(checkpoints[0], copy)
    return copy


def _link_to_a_copy(path: Path, target_dir: Path) -> None:
    """path replaced by a link to a regular file of the same bytes elsewhere (its size and hash still match)."""
    target = target_dir / f"{path.name}.elsewhere"
    shutil.copyfile(path, target)
    path.unlink()
    path.symlink_to(target)


def test_a_checkpoint_directory_that_is_a_link_is_invalid(ours, tmp_path):
    (tmp_path / "step-00000001").symlink_to(ours)
    with pytest.raises(ck.CheckpointInvalid, match="the checkpoint is a symbolic link, not a directory"):
        ck.validate(tmp_path / "step-00000001")


@pytest.mark.parametrize("name", [ck.MODEL_FILE, ck.OPTIMIZER_META, ck.TRAINER_STATE])
def test_a_listed_file_that_is_a_link_to_its_very_bytes_is_invalid(ours, tmp_path, name):
    _link_to_a_copy(ours / name, tmp_path)
    with pytest.raises(ck.CheckpointInvalid, match=f"{name} is a symbolic link, not a regular file"):
        ck.validate(ours)


@pytest.mark.parametrize("name", [ck.MODEL_FILE, ck.OPTIMIZER_META])
@pytest.mark.parametrize("swap", ["a FIFO", "a symbolic link"])
def test_a_file_swapped_after_its_size_was_looked_at_is_invalid_without_blocking(ours, tmp_path, monkeypatch,
                                                                                 name, swap):
    """Between the sizes (all first) and the hashes, `name` is replaced: the hash opens it without following a
    link or blocking."""
    real = ck.table_problems

    def sizes_then_swap(table, size_of, sha256_of=None, *args, **kwargs):
        def swapped_sha256_of(n):
            if n == name and not (ours / name).is_symlink() and not (ours / name).is_fifo():
                if swap == "a FIFO":
                    (ours / name).unlink()
                    os.mkfifo(ours / name)
                else:
                    _link_to_a_copy(ours / name, tmp_path)
            return sha256_of(n)

        return real(table, size_of, swapped_sha256_of, *args, **kwargs)

    monkeypatch.setattr(ck, "table_problems", sizes_then_swap)
    with pytest.raises(ck.CheckpointInvalid, match=f"cannot read {name}: {swap}"):
        without_blocking(lambda: ck.validate(ours), ours / name)


def _validate_then_link(monkeypatch, other: Path, tmp_path: Path) -> None:
    """validate as it is; then, once it passed, model.safetensors replaced by a link to another checkpoint's."""
    real = ck.validate

    def validate_then_link(path, *args, **kwargs):
        state = real(path, *args, **kwargs)
        model = Path(path) / ck.MODEL_FILE
        model.unlink()
        model.symlink_to(other / ck.MODEL_FILE)
        return state

    monkeypatch.setattr(ck, "validate", validate_then_link)


def test_init_from_loads_the_weights_it_validated_not_a_link_swapped_in_since(checkpoints, ours, tmp_path,
                                                                              monkeypatch):
    from minilmd.trainer.checkpoint.init_weights import load_init

    cfg = RunConfig(source="test")
    cfg.model = as_model_section(CHECKPOINT_MODEL)
    cfg.init.from_ = str(ours)
    _validate_then_link(monkeypatch, checkpoints[1], tmp_path)
    with pytest.raises(ConfigError, match="cannot read model.safetensors: a symbolic link"):
        load_init(cfg)


def test_export_reads_the_weights_it_validated_not_a_link_swapped_in_since(checkpoints, ours, tmp_path,
                                                                           monkeypatch):
    _validate_then_link(monkeypatch, checkpoints[1], tmp_path)
    with pytest.raises(ExportError, match="cannot read model.safetensors: a symbolic link"):
        read_checkpoint(ours)


def test_weights_replaced_in_place_since_validation_are_not_loaded(checkpoints, ours):
    """Not a link: the file rewritten with another checkpoint's weights (same size) after validation."""
    ck.validate(ours)
    shutil.copyfile(checkpoints[1] / ck.MODEL_FILE, ours / ck.MODEL_FILE)
    with pytest.raises(ck.CheckpointInvalid, match="model.safetensors: changed since it was validated"):
        ck.read_validated(ours, ck.MODEL_FILE)
