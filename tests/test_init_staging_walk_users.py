"""Staging a teammate's checkpoint (init.from on a share; a real second user, nobody, and a third uid without an
account) copies it from the very directory resolve opened and judged, through its descriptor
(daemon/jobs/initstage.py `_copy_checkpoint`, minilmd/init_place.py `reopen`): each file a regular file of hers or
ours, no link followed, no FIFO opened; a directory or a file swapped in after the resolution is refused, named.

Reproduced on the code before (it copied `source.path / name` by path, with no owner): a third user's file at a
name the manifest lists was copied into scratch and trained from; a step directory swapped after the resolution for
a link to another checkpoint of hers was followed and that checkpoint staged under the name LATEST gave; a third
user's directory swapped in was refused only by the manifest's reading ("is unreadable (owned by uid ...)"), final
at once. The swaps are made at one moment, deterministically: right after the resolution returns.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from init_from_helpers import swap_after_resolution
from minilmd import names
from minilmd.daemon.jobs import initstage
from minilmd.daemon.jobs.staging_errors import SourceInvalid, SourceUnreachable
from minilmd.init_source import InitSourceError
from second_user import chown_tree, second_user, shared_dir, teammate  # noqa: F401 - teammate: a fixture
from waiting import without_blocking

pytestmark = pytest.mark.root

THIRD_UID = 54321
STEP, OTHER_STEP = "step-00000001", "step-00000002"
WEIGHTS = "model.safetensors"


def _checkpoint(step: Path, weights: bytes) -> Path:
    step.mkdir(parents=True)
    (step / WEIGHTS).write_bytes(weights)
    listed = {WEIGHTS: {"size": len(weights), "sha256": hashlib.sha256(weights).hexdigest()}}
    (step / names.MANIFEST).write_text(json.dumps({"step": int(step.name[5:]), "files": listed}))
    return step


def _teammates_root(teammate) -> Path:
    """Her checkpoint root: LATEST -> step-00000001 (weights b"1"*64), and an older step-00000002 of other weights,
    all hers."""
    (uid, gid), where = teammate
    root = where / "hers" / "checkpoints"
    _checkpoint(root / STEP, b"1" * 64)
    _checkpoint(root / OTHER_STEP, b"2" * 64)
    (root / names.LATEST).write_text(STEP)
    chown_tree(where / "hers", uid, gid)
    return root


def _staged_weights(scratch: Path) -> bytes:
    return (scratch / initstage.INIT_DIR / initstage.INIT_CHECKPOINT / WEIGHTS).read_bytes()


def test_a_teammates_checkpoint_is_staged_from_her_directory(teammate, tmp_path):
    root = _teammates_root(teammate)
    staged = initstage.stage_init(str(root), tmp_path / "scratch")
    assert initstage.init_problems(staged) == []
    assert _staged_weights(tmp_path / "scratch") == b"1" * 64


def test_a_third_users_file_in_her_checkpoint_is_refused_named_never_copied(teammate, tmp_path):
    root = _teammates_root(teammate)
    os.chown(root / STEP / WEIGHTS, THIRD_UID, THIRD_UID)  # the bytes her manifest lists, a third user's file
    with pytest.raises(SourceInvalid, match=f"{root / STEP}: {WEIGHTS} is owned by uid {THIRD_UID}, not by the "
                                            f"source's owner, user nobody \\(uid {teammate[0][0]}\\), nor by you"):
        initstage.stage_init(str(root), tmp_path / "scratch")
    assert not (tmp_path / "scratch" / initstage.INIT_DIR).exists()


def _third_users_file(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)
    os.chown(path, THIRD_UID, THIRD_UID)


def _link_to_the_same_bytes(path: Path, data: bytes) -> None:
    decoy = path.parent.parent.parent / "decoy"
    decoy.write_bytes(data)
    path.unlink()
    path.symlink_to(decoy)


def _fifo(path: Path, data: bytes) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("swap, found", [
    (_third_users_file, f"is owned by uid {THIRD_UID}, not by the source's owner"),
    (_link_to_the_same_bytes, "is a symbolic link: not followed"),
    (_fifo, "is a FIFO: not read"),
], ids=["a third user's file", "a link", "a FIFO"])
def test_a_file_swapped_in_after_the_resolution_is_refused_naming_what_was_found(teammate, tmp_path, monkeypatch,
                                                                                   swap, found):
    root = _teammates_root(teammate)
    weights = root / STEP / WEIGHTS
    swap_after_resolution(monkeypatch, lambda: swap(weights, b"1" * 64))  # the very bytes listed: only what it is tells
    with pytest.raises(SourceInvalid, match=f"{root / STEP}: {WEIGHTS} {found}"):
        without_blocking(lambda: initstage.stage_init(str(root), tmp_path / "scratch"), weights)
    assert not (tmp_path / "scratch" / initstage.INIT_DIR).exists()


def _link_to_her_other_checkpoint(root: Path) -> None:
    (root / STEP).rename(root / "set-aside")
    (root / STEP).symlink_to(root / OTHER_STEP)


def _third_users_directory(root: Path) -> None:
    (root / STEP).rename(root / "set-aside")
    shutil.copytree(root / "set-aside", root / STEP)
    chown_tree(root / STEP, THIRD_UID, THIRD_UID)


@pytest.mark.parametrize("swap, found, final", [
    (_link_to_her_other_checkpoint, "a symbolic link", f"{STEP} is a symbolic link: not followed"),
    (_third_users_directory, "another directory", f"{STEP} is owned by uid {THIRD_UID}"),
], ids=["a link to another checkpoint of hers", "a third user's directory"])
def test_a_step_directory_swapped_after_the_resolution_is_not_copied(teammate, tmp_path, monkeypatch, swap, found,
                                                                    final):
    """What was resolved and judged is gone from its name: nothing is read from what stands there now; staging
    waits (SourceUnreachable), and the next attempt, resolving again, refuses what it finds there (final)."""
    root = _teammates_root(teammate)
    swap_after_resolution(monkeypatch, lambda: swap(root))
    with pytest.raises(SourceUnreachable, match=f"{root / STEP}: not the directory resolved a moment ago "
                                                f"\\({found} there now: replaced since\\)"):
        initstage.stage_init(str(root), tmp_path / "scratch")
    assert not (tmp_path / "scratch" / initstage.INIT_DIR).exists()
    monkeypatch.undo()
    with pytest.raises(InitSourceError, match=final):
        initstage.stage_init(str(root), tmp_path / "scratch")
