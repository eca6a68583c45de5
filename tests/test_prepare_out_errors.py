"""`prepare --out` that cannot be written, said as what failed: a permission with whose directory it is, a read-only
file system, a disk that failed, a name too long (minilmd/corpus/exits.py `_what_failed`); a full disk or quota as
before (tests/test_prepare_full_disk.py). Before, every OSError was "cannot write in OUT: <what the system said>",
the advice of a full disk or a permission for a disk that failed. Each error here is a real one: a real second user,
a read-only tmpfs, a FUSE mount whose writes fail, a name past the file system's limit. Exit 74, one line, nothing
left of this run's output, and nothing of anyone else's touched."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from data_helpers import no_leftovers
from second_user import second_user, shared, user_python  # noqa: F401 - shared: a fixture

CLI = "import sys; from minilmd.cli import main; sys.argv = ['minilmd', *sys.argv[1:]]; main()"


def _prepare(jsonl, tokenizer, out: Path, as_nobody: bool = False) -> subprocess.CompletedProcess:
    args = ["prepare", str(jsonl), "--tokenizer", str(tokenizer), "--out", str(out), "--workers", "0"]
    argv = user_python(CLI, *args) if as_nobody else [sys.executable, "-m", "minilmd.cli", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd="/")
    assert done.returncode == 74 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and ".prepare-" not in done.stderr, done.stderr  # one line, no temp name
    return done


@pytest.mark.root
def test_permission_denied_names_whose_directory_it_is(shared, demo_jsonl, tokenizer):
    second_user()
    tok, jsonl = shared / "tokenizer.json", shared / "docs.jsonl"
    shutil.copyfile(tokenizer, tok)
    shutil.copyfile(demo_jsonl[0], jsonl)
    for path in (tok, jsonl):
        path.chmod(0o644)
    roots = shared / "roots"
    roots.mkdir(mode=0o755)  # root's: the second user may not write it
    (roots / "kept.txt").write_text("root's own\n")
    out = roots / "corpus"
    said = _prepare(jsonl, tok, out, as_nobody=True).stderr
    assert said.startswith(f"prepare: cannot write in {out}: Permission denied (the directory {roots} belongs to "
                           f"user root (uid 0), mode 755); nothing written; choose a directory you may write"), said
    assert no_leftovers(out) and sorted(os.listdir(roots)) == ["kept.txt"]


def test_a_read_only_file_system_is_said_so(read_only_dir, demo_jsonl, tokenizer):
    if os.geteuid() != 0:
        pytest.skip("needs root: a read-only tmpfs (a mode 500 directory is a permission, not a read-only mount)")
    out = read_only_dir / "corpus"
    said = _prepare(demo_jsonl[0], tokenizer, out).stderr
    assert said.startswith(f"prepare: cannot write in {out}: it is on a read-only file system "
                           f"({os.strerror(errno.EROFS)}); nothing written; choose a directory on a file system "
                           f"mounted read-write"), said


def test_a_name_too_long_for_the_file_system_is_said_so(tmp_path, demo_jsonl, tokenizer):
    out = tmp_path / ("d" * 300) / "corpus"  # a directory above past NAME_MAX (255): the kernel's own ENAMETOOLONG
    said = _prepare(demo_jsonl[0], tokenizer, out).stderr
    assert f"prepare: cannot write in {out}: a name there is too long for its file system " \
           f"({os.strerror(errno.ENAMETOOLONG)}); nothing written; choose a shorter path" in said, said
    assert os.listdir(tmp_path) == []


def test_a_disk_that_fails_is_said_as_one_not_as_a_permission_or_a_full_disk(faultfs, demo_jsonl, tokenizer):
    (faultfs.root / "kept.txt").write_text("another job's\n")
    faultfs.fail_writes("*.bin", errno.EIO)
    out = faultfs.root / "corpus"
    said = _prepare(demo_jsonl[0], tokenizer, out).stderr
    assert said.startswith(f"prepare: the disk (or share) under {out} failed while it was written to "
                           f"({os.strerror(errno.EIO)}); nothing written; fix the disk or the share"), said
    assert faultfs.hits("error")  # the fault was met
    faultfs.clear()
    assert no_leftovers(out) and (faultfs.root / "kept.txt").read_text() == "another job's\n"
