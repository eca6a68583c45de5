"""`minilmd bench checkpoint` writes only into a directory of its own, and removes only that.

The defect: its --dir defaulted to the fixed name /dev/shm/minilmd-bench-checkpoint in a world-writable directory,
and the bench `shutil.rmtree`d whatever sat there first and its --dir itself after: another user's directory there
was deleted (root's bench deletes anyone's), a link planted there ended the bench, and `--dir /tmp/shared` deleted
that whole directory with everything in it. Now the bench makes a fresh private directory (trainer/bench/
checkpoint.py work_dir), by default under /dev/shm, in --dir when given, and removes that alone."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from minilmd.cli import app
from second_user import chown_tree, second_user, shared  # noqa: F401 - shared: the fixture

OLD_FIXED_PATH = Path("/dev/shm/minilmd-bench-checkpoint")
TINY = ["--hidden", "64", "--layers", "1", "--repeats", "1"]


def bench(*args: str) -> Path:
    """Run the bench on a tiny model; the directory it says it wrote into."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["bench", "checkpoint", *TINY, *args])
    assert result.exit_code == 0, result.output
    found = re.search(r"saves per method into (\S+); ", result.output)
    assert found, result.output
    return Path(found[1])


def theirs(where: Path, uid: int, gid: int) -> Path:
    """A directory of the second user's with a file in it, at `where`."""
    where.mkdir()
    (where / "their-file").write_text("theirs\n")
    chown_tree(where, uid, gid)
    return where / "their-file"


@pytest.mark.slow
def test_another_users_directory_or_link_at_the_old_fixed_path_is_left_alone(shared):
    uid, gid = second_user()
    if not OLD_FIXED_PATH.parent.is_dir():
        pytest.skip("no /dev/shm: the old fixed path was there")
    if os.path.lexists(OLD_FIXED_PATH):
        pytest.skip(f"{OLD_FIXED_PATH} exists already: not this test's to plant over")
    planted = None
    try:
        their_file = theirs(OLD_FIXED_PATH, uid, gid)
        planted = os.lstat(OLD_FIXED_PATH)
        used = bench()
        assert used != OLD_FIXED_PATH and OLD_FIXED_PATH not in used.parents, used
        assert not os.path.lexists(used)  # its own directory, removed
        assert their_file.read_text() == "theirs\n" and sorted(os.listdir(OLD_FIXED_PATH)) == ["their-file"]
        their_file.unlink()
        OLD_FIXED_PATH.rmdir()
        planted = None

        target_file = theirs(shared / "target", uid, gid)  # a link of the second user's to a directory of hers
        OLD_FIXED_PATH.symlink_to(target_file.parent)
        os.chown(OLD_FIXED_PATH, uid, gid, follow_symlinks=False)
        planted = os.lstat(OLD_FIXED_PATH)
        used = bench()
        assert used != OLD_FIXED_PATH and OLD_FIXED_PATH not in used.parents and not os.path.lexists(used), used
        assert OLD_FIXED_PATH.is_symlink() and os.readlink(OLD_FIXED_PATH) == str(target_file.parent)
        assert os.listdir(target_file.parent) == ["their-file"] and target_file.read_text() == "theirs\n"
    finally:
        _remove_planted(planted)


def _remove_planted(planted: os.stat_result | None) -> None:
    """What this test planted at the old fixed path, only while that name still leads to it."""
    if planted is None:
        return
    now = os.lstat(OLD_FIXED_PATH) if os.path.lexists(OLD_FIXED_PATH) else None
    if now is None or (now.st_dev, now.st_ino) != (planted.st_dev, planted.st_ino):
        return
    if OLD_FIXED_PATH.is_symlink():
        OLD_FIXED_PATH.unlink()
    else:
        (OLD_FIXED_PATH / "their-file").unlink(missing_ok=True)
        OLD_FIXED_PATH.rmdir()


@pytest.mark.slow
def test_with_dir_it_writes_into_a_new_directory_there_and_removes_only_that(shared):
    """`--dir` a shared directory: the other user's entries in it and the directory itself stay."""
    uid, gid = second_user()
    their_file = theirs(shared / "hers", uid, gid)
    used = bench("--dir", str(shared))
    assert used.parent == shared and used.name.startswith("minilmd-bench-checkpoint-"), used
    assert not os.path.lexists(used) and shared.is_dir()
    assert sorted(os.listdir(shared)) == ["hers"] and their_file.read_text() == "theirs\n"


def test_a_dir_that_is_no_directory_is_refused_with_nothing_written(tmp_path):
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["bench", "checkpoint", *TINY, "--dir", str(tmp_path / "missing")],
                                env={"COLUMNS": "400"})  # the box wide enough for xdist's longer tmp_path: no word cut
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", result.output).split())  # rich's error box, its lines joined
    assert result.exit_code == 2 and "missing is no directory (the bench makes a new one" in said, result.output
    assert os.listdir(tmp_path) == []
