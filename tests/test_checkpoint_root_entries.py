"""A checkpoint root's own step directories only: a symbolic link or another user's directory by a step name,
planted in a root others can write, is no checkpoint of the root (minilmd/checkpoint_dirs.py list_checkpoints,
named_checkpoint; trainer/model/export_source.py resolve_checkpoint).

Reproduced on the code before: `minilmd export ROOT` took the newest `step-*` holding a manifest, whatever it was:
a planted link made the export of the root fail (`the checkpoint is a symbolic link`), and another user's valid
step-00000009 in the root was exported as the run's newest checkpoint, their weights under the run's name.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from minilmd import checkpoint as ck
from minilmd.checkpoint_dirs import PointerError, list_checkpoints, named_checkpoint
from minilmd.names import LATEST
from minilmd.trainer.model.export import read_checkpoint
from minilmd.trainer.model.export_source import resolve_checkpoint
from weights_helpers import make_run, save_run

OTHER_UID = 54321
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another uid needs root")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:
    """(the run's own step-00000001, another valid checkpoint of the same model at step 9, newer)."""
    base = tmp_path_factory.mktemp("saved")
    return save_run(base / "ours", 1, *make_run(1, seed=0)), save_run(base / "other", 9, *make_run(9, seed=1))


@pytest.fixture
def root(saved, tmp_path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    shutil.copytree(saved[0], root / saved[0].name)
    return root


def _chown_tree(path: Path, uid: int) -> None:
    os.chown(path, uid, -1)
    for where, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(where, name), uid, -1)


def _weights_of(ckpt: Path) -> dict:
    from safetensors.torch import load

    return load((ckpt / ck.MODEL_FILE).read_bytes())


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_link_by_a_step_name_is_passed_by_and_the_roots_newest_exported(saved, root, capsys):
    (root / "step-00000009").symlink_to(saved[1])
    passed_by: dict[str, str] = {}
    assert list_checkpoints(root, passed_by) == [root / saved[0].name]
    assert passed_by == {"step-00000009": "a symbolic link"}
    weights, _, state = read_checkpoint(root)
    assert state["step"] == 1 and _same(weights, _weights_of(saved[0]))
    assert resolve_checkpoint(root) == root / saved[0].name  # the tokenizer's look-up resolves it again
    said = capsys.readouterr().err
    assert f"{root / 'step-00000009'}: passed by: a symbolic link, not one of this root's checkpoints" in said
    assert said.count("passed by") == 1  # resolved several times, said once


@needs_root
def test_another_users_step_directory_in_our_root_is_never_exported_as_its_newest(saved, root, capsys):
    planted = root / "step-00000009"
    shutil.copytree(saved[1], planted)
    _chown_tree(planted, OTHER_UID)
    ck.validate(planted)  # a valid checkpoint, newer than the run's: before, the one exported
    (root / LATEST).write_text("step-00000009\n")  # even named by LATEST
    assert resolve_checkpoint(root) == root / saved[0].name
    weights, _, state = read_checkpoint(root)
    assert state["step"] == 1 and _same(weights, _weights_of(saved[0]))
    assert f"owned by uid {OTHER_UID} (the root is uid 0's)" in capsys.readouterr().err
    with pytest.raises(PointerError, match=f"names step-00000009, which is owned by uid {OTHER_UID}"):
        named_checkpoint(root / LATEST)


@needs_root
def test_another_users_root_lists_their_own_step_directories(saved, root):
    """Exporting another user's run root reads their checkpoints: the root's owner's are the root's."""
    shutil.copytree(saved[1], root / "step-00000009")
    _chown_tree(root, OTHER_UID)
    assert list_checkpoints(root) == [root / saved[0].name, root / "step-00000009"]
    assert resolve_checkpoint(root) == root / "step-00000009"


def test_latest_naming_a_link_falls_back_to_the_roots_newest(saved, root):
    (root / "step-00000009").symlink_to(saved[1])
    (root / LATEST).write_text("step-00000009\n")
    assert resolve_checkpoint(root) == root / saved[0].name
    with pytest.raises(PointerError, match="names step-00000009, which is a symbolic link"):
        named_checkpoint(root / LATEST)
