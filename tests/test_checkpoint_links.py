"""The strict validation (minilmd/checkpoint.py `validate`: init.from checkpoints, remote checkpoints, export inputs)
and the loaders after it never follow a link nor block on a FIFO.

Reproduced on the code before: the sizes were checked with os.stat (a link to a regular file of the listed size
and hash passed, as did a checkpoint directory that is a link), the files hashed with a plain open() (a FIFO swapped
in after its size was looked at blocked the hash for ever), and the weights then loaded with safetensors'
load_file of the path (a link swapped in after validation loaded another file's weights); later through
`read_validated`, which read the manifest and the weights file a second time: whoever can write the checkpoint put
a consistent manifest and other weights in place after validation, and those, never scanned (shapes, dtypes,
NaN), were loaded. The loaders now take the weights from the validation's own read (`validated_weights`).
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
from minilmd.untrusted import sha256_regular
from waiting import without_blocking
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


def _tensors(model_file: Path) -> dict:
    from safetensors.torch import load

    return load(model_file.read_bytes())


def _same_tensors(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _swap_for_another(ckpt: Path, other: Path) -> None:
    """The attacker: every file of `ckpt` replaced (each by a rename, as a writer would) by another valid
    checkpoint's of the same step and model: a manifest and weights consistent with each other, so that a reader
    of the path finds a valid checkpoint, just not the one that was checked."""
    for name in os.listdir(other):
        shutil.copyfile(other / name, ckpt / f".{name}.new")
        os.replace(ckpt / f".{name}.new", ckpt / name)


def _swap_once_the_weights_were_read(monkeypatch, swap) -> list[bool]:
    """`swap()` runs inside the validation, once every file was hashed and scanned (the weights included), before
    the tensors' shapes are checked: where no check is left to see it. The loaders that read the weights file again
    afterwards (before: read_validated) read what the swap put there. Returns a list that holds one entry once the
    swap has run: a test asserts it, so that a loader no longer validating through `_verify_files` fails it, not
    passes without a swap."""
    real, swapped = ck._verify_files, []

    def read_then_swapped(*args):
        verified = real(*args)
        if not swapped:
            swapped.append(True)
            swap()
        return verified

    monkeypatch.setattr(ck, "_verify_files", read_then_swapped)
    return swapped


def test_the_weights_validated_are_those_handed_back_whatever_is_swapped_in_after(checkpoints, ours):
    """validated_weights hands back the bytes it hashed and scanned; a consistent checkpoint swapped in after it
    returned (which would validate itself) is not what the caller holds."""
    original = (ours / ck.MODEL_FILE).read_bytes()
    validated = ck.validated_weights(ours)
    _swap_for_another(ours, checkpoints[1])
    ck.validate(ours)  # the swapped-in pair is consistent: a second read would have loaded it
    assert (ours / ck.MODEL_FILE).read_bytes() != original
    assert validated.weights == original
    assert validated.manifest_sha256 == sha256_regular(checkpoints[0] / ck.MANIFEST)
    from safetensors.torch import load

    assert _same_tensors(load(validated.weights), _tensors(checkpoints[0] / ck.MODEL_FILE))


def test_validated_weights_refuses_what_validate_refuses(ours):
    """The same checks as validate: a NaN in the weights is invalid, and no bytes are handed back."""
    _nan_weights_consistently(ours)
    with pytest.raises(ck.CheckpointInvalid, match="non-finite"):
        ck.validated_weights(ours)


def _rewrite_consistently(ckpt: Path, name: str, data: bytes) -> None:
    """`name` rewritten and the manifest updated to match: only the checks on contents can refuse it."""
    import hashlib
    import json

    (ckpt / name).write_bytes(data)
    manifest = json.loads((ckpt / ck.MANIFEST).read_text())
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / ck.MANIFEST).write_text(json.dumps(manifest))


def _after_validate(monkeypatch, swap) -> list[bool]:
    """`swap()` runs each time validated_weights has passed a checkpoint: after export's one validation. Returns a
    list with an entry per swap run (asserted, as _swap_once_the_weights_were_read's)."""
    real, swapped = ck.validated_weights, []

    def validate_then_swap(path, *args, **kwargs):
        validated = real(path, *args, **kwargs)
        swapped.append(True)
        swap()
        return validated

    monkeypatch.setattr(ck, "validated_weights", validate_then_swap)
    return swapped


def _nan_weights_consistently(ckpt: Path) -> None:
    from safetensors.torch import save

    weights = _tensors(ckpt / ck.MODEL_FILE)
    next(iter(weights.values())).view(-1)[0] = float("nan")
    _rewrite_consistently(ckpt, ck.MODEL_FILE, save(weights))


def test_export_never_loads_weights_that_no_validation_scanned(checkpoints, ours, monkeypatch):
    """Weights with a NaN and a manifest hashing them put in place once export's validation passed: the weights
    exported are those validated (before: read_validated checked the hash against the manifest read again, and
    the NaN weights, never scanned, were exported; then a second validation refused them)."""
    swapped = _after_validate(monkeypatch, lambda: _nan_weights_consistently(ours))
    weights, _, _ = read_checkpoint(ours)
    assert swapped
    assert _same_tensors(weights, _tensors(checkpoints[0] / ck.MODEL_FILE))


def test_export_loads_the_weights_its_loading_validated_not_a_checkpoint_swapped_in_since(checkpoints, ours,
                                                                                         monkeypatch):
    """Another consistent checkpoint swapped in once the loading's own validation read the weights: those
    validated are loaded, not the path read again."""
    swapped = _swap_once_the_weights_were_read(monkeypatch, lambda: _swap_for_another(ours, checkpoints[1]))
    weights, _, _ = read_checkpoint(ours)
    assert swapped
    assert _same_tensors(weights, _tensors(checkpoints[0] / ck.MODEL_FILE))


def test_export_loads_no_link_swapped_in_after_validation(checkpoints, ours, monkeypatch):
    model = ours / ck.MODEL_FILE

    def link_to_the_others():
        if not model.is_symlink():
            model.unlink()
            model.symlink_to(checkpoints[1] / ck.MODEL_FILE)

    swapped = _after_validate(monkeypatch, link_to_the_others)
    weights, _, _ = read_checkpoint(ours)
    assert swapped
    assert model.is_symlink()
    assert _same_tensors(weights, _tensors(checkpoints[0] / ck.MODEL_FILE))


def _init_from(ours: Path) -> RunConfig:
    cfg = RunConfig(source="test")
    cfg.model = as_model_section(CHECKPOINT_MODEL)
    cfg.init.from_ = str(ours)
    return cfg


def test_init_from_loads_the_weights_it_validated_not_a_link_swapped_in_since(checkpoints, ours, monkeypatch):
    """The manifest untouched, the weights file swapped for a link once scanned: the weights validated load, and
    the record names that manifest. Before: `cannot read model.safetensors: a symbolic link`, a refusal."""
    from minilmd.trainer.checkpoint.init_weights import load_init

    model = ours / ck.MODEL_FILE

    def link_to_the_others():
        model.unlink()
        model.symlink_to(checkpoints[1] / ck.MODEL_FILE)

    swapped = _swap_once_the_weights_were_read(monkeypatch, link_to_the_others)
    weights, record = load_init(_init_from(ours))
    assert swapped
    assert _same_tensors(weights, _tensors(checkpoints[0] / ck.MODEL_FILE))
    assert record["manifest_sha256"] == sha256_regular(checkpoints[0] / ck.MANIFEST)


def test_init_from_a_checkpoint_swapped_for_another_while_read_loads_nothing_of_either(checkpoints, ours,
                                                                                      monkeypatch):
    """Another consistent checkpoint swapped in once the weights were validated: the record init.from keeps (the
    manifest read for it) would name the other's while the weights are the first's, so nothing is loaded.
    Before: read_validated read the other's manifest and weights again, and the run started from weights that were
    never scanned (shapes, dtypes, NaN), under a manifest never validated."""
    from minilmd.trainer.checkpoint.init_weights import load_init

    swapped = _swap_once_the_weights_were_read(monkeypatch, lambda: _swap_for_another(ours, checkpoints[1]))
    with pytest.raises(ConfigError, match="manifest.json changed while it was read"):
        load_init(_init_from(ours))
    assert swapped
