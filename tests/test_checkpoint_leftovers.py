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


def test_a_root_that_is_the_users_own_link_to_a_bigger_disk_is_swept_through_it(tmp_path, capsys):
    """scratch/checkpoints is the user's own link to a directory of hers on a bigger disk (review12a F4): before,
    the root was opened O_NOFOLLOW and nothing was swept, unsaid, while list_checkpoints followed the link. Now
    the killed save's debris there is removed through the opened target; the link and the target stay."""
    disk = tmp_path / "bigdisk"
    disk.mkdir()
    stale = _half_save(disk / f".tmp-step-00000008-{_dead_pid()}")
    root = tmp_path / "checkpoints"
    root.symlink_to(disk)
    assert checkpoint_dirs.clean_stale_tmp(root) == [root / stale.name]
    assert not os.path.lexists(stale) and root.is_symlink() and disk.is_dir()
    assert f"removed {root / stale.name}" in capsys.readouterr().err


def test_a_root_linked_to_another_users_directory_is_not_swept_and_said(shared, capsys):
    """The user's own link as the root, but to a directory of another user's (a real `nobody`): not swept, and
    said, with the uid; that user's leftover stays."""
    uid, _gid = second_user()
    name = f".tmp-step-00000007-{_dead_pid()}"
    sh_as_user(f"mkdir -p theirs/{name}", cwd=shared)
    root = shared.parent / f"{shared.name}-checkpoints"
    root.symlink_to(shared / "theirs")
    try:
        assert checkpoint_dirs.clean_stale_tmp(root) == []
        assert (shared / "theirs" / name).is_dir()
        err = capsys.readouterr().err
        assert f"{root}: links to a directory of another user's (uid {uid})" in err, err
    finally:
        root.unlink()
