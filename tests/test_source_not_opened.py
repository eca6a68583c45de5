"""A source of `prepare`, `tokenizer train` or `corpus report` that is not a file one can read (not there, a
directory, a FIFO, another user's private file) is a bad argument, said plainly with its path, exit 2, as a config
file or a --tokenizer that is not there is. Before, each was bad data (exit 65, `cannot open ([Errno 2] No such
file or directory: ...)`), told like a corpus with a bad line. A source whose disk fails at the open is a read that
failed (74), as one that fails while read is."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

import pytest

from data_helpers import no_leftovers, write_jsonl
from minilmd.corpus.exits import data_error_exit
from minilmd.corpus.sources.jsonl import SourceNotOpened, SourceReadError, not_opened
from minilmd.protocol import EXIT_CONFIG, EXIT_IO

CLI = [sys.executable, "-m", "minilmd.cli"]
COMMANDS = ("prepare", "tokenizer train", "corpus report")


def argv(command: str, source, tmp_path, tokenizer) -> list[str]:
    return {"prepare": ["prepare", str(source), "--tokenizer", str(tokenizer), "--out", str(tmp_path / "c"),
                        "--workers", "0"],
            "tokenizer train": ["tokenizer", "train", str(source), "--out", str(tmp_path / "t" / "tokenizer.json")],
            "corpus report": ["corpus", "report", str(source), "--workers", "0"]}[command]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_source_is_a_bad_argument_named_plainly(tmp_path, tokenizer, command):
    missing = tmp_path / "typo.jsonl"
    done = subprocess.run([*CLI, *argv(command, missing, tmp_path, tokenizer)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert done.stderr.strip() == f"error: {missing}: no such file", done.stderr
    assert no_leftovers(tmp_path / "c") and not (tmp_path / "t").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_directory_given_for_a_source_is_a_bad_argument(tmp_path, tokenizer, command):
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", ["a document"])  # the file meant, inside
    done = subprocess.run([*CLI, *argv(command, folder, tmp_path, tokenizer)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == EXIT_CONFIG, done.stderr
    said = "a directory without meta.json" if command == "corpus report" else "cannot open (a directory, not a"
    assert done.stderr.startswith(f"error: {folder}: {said}"), done.stderr


@pytest.mark.parametrize("command", ["prepare", "tokenizer train"])
def test_a_url_that_is_not_opened_is_a_bad_argument(tmp_path, tokenizer, command):
    """A chain over a local path (refused: minilmd/urls.py chain_over_local) or a protocol fsspec does not know.
    Before, both were bad data (65), told like a corpus with a bad line (review2 F4)."""
    write_jsonl(tmp_path / "a.jsonl", ["a document"])
    for url in (f"simplecache::{tmp_path}/a.jsonl", "nosuchproto://bucket/a.jsonl"):
        done = subprocess.run([*CLI, *argv(command, url, tmp_path, tokenizer)], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == EXIT_CONFIG, done.stderr
        assert done.stderr.startswith(f"error: {url}: cannot open ("), done.stderr


@pytest.mark.parametrize("command", ["prepare", "corpus report"])
def test_a_source_one_may_not_read_is_a_bad_argument_not_bad_data(tmp_path, tokenizer, command):
    """Another user's private file (0600), named by the second user. (`tokenizer train` opens its sources through
    the same Source, in a spawned process that the second user's interpreter here cannot start: minilmd is not
    importable there.)"""
    from second_user import shared_dir, user_python

    shared = shared_dir()
    try:
        private = write_jsonl(shared / "private.jsonl", ["her own words"])
        private.chmod(0o600)
        used = shared / "tokenizer.json"
        used.write_bytes(tokenizer.read_bytes())
        used.chmod(0o644)
        code = "import sys\nfrom minilmd.cli import app\nsys.argv[0] = 'minilmd'\napp()\n"
        done = subprocess.run(user_python(code, *argv(command, private, shared, used)), capture_output=True,
                              text=True, cwd="/", timeout=300)
        assert done.returncode == EXIT_CONFIG, done.stderr
        assert f"error: {private}: cannot open: permission denied" in done.stderr, done.stderr
    finally:
        shutil.rmtree(shared)


def test_a_disk_that_fails_at_the_open_is_a_read_that_failed_not_the_path_given():
    """The one home of the words: a source gone is a bad argument (2); EIO at the open a read to try again (74)."""
    assert isinstance(gone := not_opened("/x.jsonl", FileNotFoundError(errno.ENOENT, "No such file")),
                      SourceNotOpened)
    assert str(gone) == "/x.jsonl: no such file" and data_error_exit(gone).exit_code == EXIT_CONFIG
    failed = not_opened("/x.jsonl", OSError(errno.EIO, os.strerror(errno.EIO)))
    assert isinstance(failed, SourceReadError) and data_error_exit(failed).exit_code == EXIT_IO
