"""checkpoint_dirs.clean_stale_tmp, the trainer's clean-up of a checkpoint root's `.tmp-*` at start: a dead
writer's directory is removed only when it is this user's real directory; a symbolic link and another user's entry
by such a name are left, said on stderr, and not among those it returns."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from minilmd import checkpoint_dirs
from second_user import second_user, sh_as_user, shared  # noqa: F401 - shared: a fixture


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _half_save(path: Path) -> Path:
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"half a save\n")
    return path


def test_a_link_by_a_dead_writers_name_is_left_said_and_not_reported_removed(tmp_path, capsys):
    """A symbolic link named as a dead writer's `.tmp-step-...-PID`, to a directory elsewhere: before, is_dir()
    followed it, rmtree refused it silently (ignore_errors) and it was returned as removed. Now it is left, said,
    and not returned; what it leads to is untouched; a real leftover beside it is removed and said."""
    root = tmp_path / "checkpoints"
    root.mkdir()
    elsewhere = _half_save(tmp_path / "elsewhere")
    link = root / f".tmp-step-00000007-{_dead_pid()}"
    link.symlink_to(elsewhere)
    stale = _half_save(root / f".tmp-step-00000008-{_dead_pid()}")
    assert checkpoint_dirs.clean_stale_tmp(root) == [stale]
    assert link.is_symlink() and not os.path.lexists(stale)
    assert (elsewhere / "model.safetensors").read_bytes() == b"half a save\n"
    err = capsys.readouterr().err
    assert f"{link}: a symbolic link by a checkpoint writer's temporary name; left as it is" in err, err
    assert f"removed {stale}: the temporary directory of a checkpoint writer" in err, err


def test_another_users_directory_by_a_dead_writers_name_is_left_and_said(shared, capsys):
    """A root in a directory others may write: another user (a real `nobody`) made a `.tmp-...-PID` directory there
    named by a dead pid. Before, it was removed (rmtree of another user's entry: unlink needs no ownership, and
    root needs no permission at all). Now it is left untouched, said with its uid, and not returned."""
    uid, _gid = second_user()
    name = f".tmp-step-00000007-{_dead_pid()}"
    sh_as_user(f"mkdir {name} && echo theirs > {name}/model.safetensors", cwd=shared)
    assert checkpoint_dirs.clean_stale_tmp(shared) == []
    assert (shared / name / "model.safetensors").read_text() == "theirs\n" and os.lstat(shared / name).st_uid == uid
    err = capsys.readouterr().err
    assert f"{shared / name}: left as it is: the temporary directory of a killed checkpoint writer, but another " \
           f"user's (uid {uid})" in err, err
