"""What the place rule's walk (minilmd/place_rule.py walk_to, place_problem) says when it cannot go on: a removed
working directory (an absolute path needs none), a full file system, a read-only directory, a directory without
search permission, a file in the way; each said with the full path, an exit status, never a traceback."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import fsio, place_rule
from minilmd.config import load_config
from minilmd.protocol import EXIT_CONFIG, EXIT_SCRATCH_FULL
from second_user import sh_as_user, shared, user_python  # noqa: F401 - shared: a fixture
from supervisor_helpers import write_config


@pytest.fixture
def full_fs(tmp_path):
    """A tmpfs with no inode left (nr_inodes=1: its root's): every mkdir in it is ENOSPC. Unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    where = tmp_path / "full"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=1,mode=0755", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs failed here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_an_absolute_path_is_walked_from_a_removed_working_directory(tmp_path, monkeypatch):
    """walk_to called getcwd() for every path: `minilmd run` started in a removed directory was refused ("cannot
    be made: No such file or directory") though its run.dir is absolute. getcwd() is for a relative path alone."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert place_rule.settle_run_dir(tmp_path / "runs" / "r") == tmp_path / "runs" / "r"
    assert (tmp_path / "runs" / "r").is_dir()
    with pytest.raises(FileNotFoundError):  # a relative one has nowhere to start from
        place_rule.settle_run_dir("relative/run")


def test_a_full_file_system_is_named_by_the_full_path(full_fs, capsys):
    """walk_to's errors named the component alone: `(No space left on device writing run)`."""
    with pytest.raises(OSError) as raised:
        place_rule.settle_run_dir(full_fs / "run")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(full_fs / "run")


def test_minilmd_run_says_which_run_dir_is_full(tmp_path, corpus, full_fs, capsys):
    from minilmd.daemon import preflight

    cfg = load_config(write_config(tmp_path, corpus, name="full", remote=False, run={"dir": str(full_fs / "run")}))
    with pytest.raises(preflight.RunDirFull):
        preflight.settle_run_dir(cfg)
    assert f"(No space left on device writing {full_fs / 'run'})" in capsys.readouterr().out


def test_minilmd_train_on_a_full_file_system_exits_74_with_the_path(tmp_path, corpus, full_fs, capfd, monkeypatch):
    """Before: a traceback, `OSError: [Errno 28] No space left on device: 'run'`, exit 1 (restarted for nothing)."""
    from minilmd.names import RUN_DIR_ENV
    from minilmd.trainer.loop.entry import main

    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    config = write_config(tmp_path, corpus, name="full-train", remote=False, run={"dir": str(full_fs / "run")})
    assert main(str(config)) == EXIT_SCRATCH_FULL
    err = capfd.readouterr().err
    assert f"No space left on device ({full_fs / 'run'})" in err and "Traceback" not in err, err


def test_an_output_under_a_read_only_directory_is_named_by_the_full_path(read_only_dir):
    """plot --out under a read-only directory said `Permission denied (d)`."""
    with pytest.raises(OSError) as raised:
        fsio.write_out_bytes(read_only_dir / "d" / "x.png", b"x", "--out", "the picture", "choose another")
    assert raised.value.filename == str(read_only_dir / "d")


def test_an_output_under_a_file_says_it_is_a_file(tmp_path):
    """Said `... is a symbolic link or not a directory now (never followed)` for a plain file in the way."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(place_rule.PlaceRefused, match=f"{tmp_path / 'afile'} is a file, not a directory; choose"):
        fsio.write_out_bytes(tmp_path / "afile" / "x.png", b"x", "--out", "the picture", "choose another")


def test_a_directory_above_without_search_permission_is_a_problem_not_a_crash(shared):
    """run --check, run and train crashed with PermissionError from place_rule._lstat (her own 644 directory above
    run.dir, as a user that root's bypass does not hide: nobody)."""
    sh_as_user("mkdir closed && chmod 644 closed", cwd=shared)
    code = ("import sys\nfrom minilmd.place_rule import run_dir_problem\n"
            "print(run_dir_problem(sys.argv[1]))\n")
    done = subprocess.run(user_python(code, str(shared / "closed" / "in" / "run")), capture_output=True, text=True,
                          cwd="/", timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{shared / 'closed' / 'in'} cannot be looked at: Permission denied" in done.stdout, done.stdout


def _demo_corpus(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", "demo-corpus", str(out), "--max-docs", "5"],
                          capture_output=True, text=True, timeout=120)


def test_demo_corpus_under_a_file_exits_2_in_a_read_only_directory_74(tmp_path, read_only_dir):
    """A read-only OUT is exit 74 as every output's that cannot be written (tests/test_out_messages.py)."""
    (tmp_path / "afile").write_text("x")
    for out, status in ((tmp_path / "afile" / "out", EXIT_CONFIG), (read_only_dir / "out", 74)):
        done = _demo_corpus(out)
        assert done.returncode == status and "Traceback" not in done.stderr, done.stderr
        assert str(out.parent if out.parent.name == "afile" else out) in done.stderr, done.stderr


def test_demo_corpus_on_a_full_file_system_exits_74(full_fs):
    done = _demo_corpus(full_fs / "out")
    assert done.returncode == 74 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot write in {full_fs / 'out'}: No space left on device" in done.stderr, done.stderr
    # which file system, and why freeing bytes would not help: its inodes are what is used up
    assert f"(the file system mounted at {full_fs} has no inode left for a new file; " in done.stderr, done.stderr
