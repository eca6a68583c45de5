"""`prepare --force` replaces a prepared corpus or an empty directory, nothing else: a directory of other files
(a thesis.txt), a prepared corpus with a file of someone's added to it, a plain file or a symbolic link are refused
with exit 2 and left exactly as they were."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest


def tree_digest(root: Path) -> str:
    """sha256 over the relative path and bytes of every file below root, and the names of its directories."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + (path.read_bytes() if path.is_file() else b"/"))
    return h.hexdigest()


def prepare_cli(sources, tokenizer, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", "prepare", *map(str, sources), "--tokenizer",
                           str(tokenizer), "--out", str(out), "--workers", "0", "--val-fraction", "0.1", *extra],
                          capture_output=True, text=True, timeout=120)


def leftovers(out: Path) -> list[Path]:
    return list(out.parent.glob(f".{out.name}.*"))


def test_force_refuses_a_directory_that_is_not_a_prepared_corpus(tmp_path, demo_jsonl, tokenizer):
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "thesis.txt").write_text("three years of work\n")
    (out / "figures").mkdir()
    before = tree_digest(out)
    done = prepare_cli(demo_jsonl[:1], tokenizer, out, "--force")
    assert done.returncode == 2, done.stderr
    assert "not a prepared corpus" in done.stderr and "thesis.txt" in done.stderr
    assert "nothing was changed" in done.stderr
    assert tree_digest(out) == before and (out / "thesis.txt").read_text() == "three years of work\n"
    assert not leftovers(out)


@pytest.mark.slow
def test_force_refuses_a_prepared_corpus_holding_a_foreign_file(tmp_path, demo_jsonl, tokenizer):
    out = tmp_path / "p"
    assert prepare_cli(demo_jsonl[:1], tokenizer, out).returncode == 0
    (out / "notes.md").write_text("which run used this corpus\n")
    before = tree_digest(out)
    done = prepare_cli(demo_jsonl[1:], tokenizer, out, "--force")
    assert done.returncode == 2 and "notes.md" in done.stderr, done.stderr
    assert tree_digest(out) == before


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_force_refuses_a_file_or_a_link(tmp_path, demo_jsonl, tokenizer, kind):
    target = tmp_path / "elsewhere"
    target.mkdir()
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("not a directory\n")
    else:
        out.symlink_to(target)
    done = prepare_cli(demo_jsonl[:1], tokenizer, out, "--force")
    assert done.returncode == 2 and "nothing was changed" in done.stderr, done.stderr
    assert (out.read_text() == "not a directory\n") if kind == "file" else (out.is_symlink() and target.is_dir())


@pytest.mark.slow
def test_force_replaces_a_prepared_corpus(tmp_path, demo_jsonl, tokenizer):
    out = tmp_path / "p"
    assert prepare_cli(demo_jsonl[:1], tokenizer, out).returncode == 0
    done = prepare_cli(demo_jsonl[1:], tokenizer, out, "--force")
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "meta.json").read_text())["sources"][0]["path"] == demo_jsonl[1]
    assert not leftovers(out)


@pytest.mark.slow
def test_force_fills_an_empty_directory(tmp_path, demo_jsonl, tokenizer):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert prepare_cli(demo_jsonl[:1], tokenizer, empty, "--force").returncode == 0
    assert (empty / "meta.json").is_file() and not leftovers(empty)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["train/tokens.bin", "meta_sibling"])
def test_force_refuses_a_corpus_whose_own_file_is_a_directory_of_other_files(tmp_path, demo_jsonl, tokenizer, where):
    """A `tokens.bin` (or tokenizer.json) that is a directory holding someone's files is not the corpus's own file:
    --force must not delete it (issue 21)."""
    out = tmp_path / "p"
    assert prepare_cli(demo_jsonl[:1], tokenizer, out).returncode == 0
    own = out / ("train/tokens.bin" if where == "train/tokens.bin" else "tokenizer.json")
    own.unlink()
    own.mkdir()
    (own / "notes.txt").write_text("not a token in sight\n")
    before = tree_digest(out)
    done = prepare_cli(demo_jsonl[1:], tokenizer, out, "--force")
    assert done.returncode == 2, done.stderr
    assert "other files in it" in done.stderr and own.name in done.stderr and "nothing was changed" in done.stderr
    assert tree_digest(out) == before and (own / "notes.txt").read_text() == "not a token in sight\n"
    assert not leftovers(out)


@pytest.mark.slow
def test_force_refuses_a_split_directory_that_is_a_link(tmp_path, demo_jsonl, tokenizer):
    out = tmp_path / "p"
    assert prepare_cli(demo_jsonl[:1], tokenizer, out).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    (out / "val").rename(elsewhere)
    (out / "val").symlink_to(elsewhere)
    done = prepare_cli(demo_jsonl[1:], tokenizer, out, "--force")
    assert done.returncode == 2 and "val" in done.stderr, done.stderr
    assert (out / "val").is_symlink() and (elsewhere / "tokens.bin").is_file()
