"""How the commands that write an output (demo-corpus, prepare, tokenizer template, plot) say that they cannot.

Before: a file in the way of --out's directory was answered with the place rule's advice to pass --group-share
(which moves no file); an output directory the user may not write ended `plot` with exit 74 but `demo-corpus` with
exit 2 naming its temporary file (`Permission denied (.reviews.jsonl.e385a0cc.tmp)`), `tokenizer template` naming
`.`, and `prepare` blaming a lock file that was never there (exit 2). Now a file in the way says what to do (exit 2),
and a directory that cannot be written is exit 74 everywhere (minilmd/corpus/exits.py), naming the directory typed.
The unwritable directory is a real second user's (nobody's, mode 555): root writes anywhere."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd.corpus.exits import EXIT_IO
from second_user import second_user, shared, user_python  # noqa: F401 - shared: a fixture
from supervisor_helpers import logged_run

CLI = "import sys; from minilmd.cli import main; sys.argv = ['minilmd', *sys.argv[1:]]; main()"


def _minilmd(*args: str, as_nobody: bool = False, cwd: Path | None = None) -> subprocess.CompletedProcess:
    argv = user_python(CLI, *args) if as_nobody else [sys.executable, "-m", "minilmd.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd or "/")


def _run_dir(where: Path) -> Path:
    """A run directory as the trainer leaves one (what plot draws), readable by the second user."""
    run_dir = logged_run(where, 10)
    for path in (run_dir, *run_dir.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return run_dir


def _commands(where: Path, out_dir: Path, tokenizer: Path, jsonl: Path) -> dict[str, list[str]]:
    return {
        "demo-corpus": ["demo-corpus", str(out_dir)],
        "prepare": ["prepare", str(jsonl), "--tokenizer", str(tokenizer), "--out", str(out_dir / "corpus")],
        "tokenizer template": ["tokenizer", "template", str(tokenizer), "--chat-template", "minimind", "--out",
                               str(out_dir / "tok.json")],
        "plot": ["plot", str(_run_dir(where)), "--out", str(out_dir / "curves.svg")],
    }


@pytest.mark.slow
def test_a_file_in_the_way_says_what_to_do_not_group_share(tmp_path, demo_jsonl, tokenizer):
    (tmp_path / "afile").write_text("the user's own file\n")
    for name, argv in _commands(tmp_path, tmp_path / "afile", tokenizer, Path(demo_jsonl[0])).items():
        if name == "plot":
            pytest.importorskip("matplotlib")
        done = _minilmd(*argv)
        assert done.returncode == 2, (name, done.stderr)
        assert f"{tmp_path / 'afile'} is a file, not a directory" in done.stderr, (name, done.stderr)
        assert "out of the way" in done.stderr and "--group-share" not in done.stderr, (name, done.stderr)
    assert (tmp_path / "afile").read_text() == "the user's own file\n"


@pytest.mark.root
@pytest.mark.slow
def test_an_unwritable_output_directory_is_exit_74_naming_it_for_every_command(shared, demo_jsonl, tokenizer):
    uid, gid = second_user()
    tok = shared / "tokenizer.json"
    shutil.copyfile(tokenizer, tok)
    jsonl = shared / "docs.jsonl"
    shutil.copyfile(demo_jsonl[0], jsonl)
    for path in (tok, jsonl):
        path.chmod(0o644)
    out_dir = shared / "ro"
    out_dir.mkdir()
    os.chown(out_dir, uid, gid)
    out_dir.chmod(0o555)  # his own directory, which he may not write
    for name, argv in _commands(shared, out_dir, tok, jsonl).items():
        if name == "plot":
            pytest.importorskip("matplotlib")
        done = _minilmd(*argv, as_nobody=True)
        assert done.returncode == EXIT_IO, (name, done.returncode, done.stderr)
        assert str(out_dir) in done.stderr and "Permission denied" in done.stderr, (name, done.stderr)
        assert ".tmp" not in done.stderr and "(.)" not in done.stderr, (name, done.stderr)  # no temporary name
        assert "lock file" not in done.stderr and "Traceback" not in done.stderr, (name, done.stderr)
    assert not list(out_dir.iterdir())


def test_an_export_that_cannot_be_written_names_out_not_its_temporary_copy():
    """export's own rule (exit 74, what to do by errno) said the OSError whole: its temporary copy's name."""
    pytest.importorskip("torch")
    from minilmd.trainer.model.export_paths import not_written

    out = Path("models/m.pth")
    said = str(not_written(out, PermissionError(13, "Permission denied", "models/.m.pth.tmp-h-1-2.ab12cd34")))
    assert said.startswith(f"{out}: the export could not be written: Permission denied;"), said
    assert ".tmp" not in said and "choose an --out you may write" in said, said


@pytest.mark.root
@pytest.mark.slow
def test_a_directory_without_search_permission_on_the_way_says_what_to_do_not_group_share(shared):
    uid, gid = second_user()
    closed = shared / "closed"
    closed.mkdir()
    os.chown(closed, uid, gid)
    closed.chmod(0o644)  # his own, which he cannot go through
    done = _minilmd("demo-corpus", str(closed / "out"), as_nobody=True)
    assert done.returncode == 2, done.stderr
    assert f"{closed / 'out'} cannot be looked at: Permission denied" in done.stderr, done.stderr
    assert "let you through" in done.stderr and "--group-share" not in done.stderr, done.stderr
