"""`minilmd tokenizer train` refuses input as `prepare` does, in the same words (found by a new user): an empty
corpus gave exit 0 and a tokenizer of the 256 bytes alone (`warning: ... only 259 entries`) where prepare says `no
documents` (exit 65); a file of plain text lines named only its first bad line where prepare names every one (the
first 20, then their number). Both now read through one rule (minilmd/corpus/sources/bad_tally.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real commands in subprocesses


def minilmd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", *args], capture_output=True, text=True, timeout=300)


def plain_text(path: Path, n: int, good: int = 0) -> Path:
    """`n` plain text lines (not JSON), then `good` {"text": ...} lines."""
    path.write_text("".join(f"just a sentence number {i}\n" for i in range(n))
                    + "".join(json.dumps({"text": f"一段文字 {i} and words"}) + "\n" for i in range(good)),
                    encoding="utf-8")
    return path


@pytest.mark.parametrize("content", ["", "\n  \n\n"], ids=["empty", "blank-lines"])
def test_a_corpus_without_a_document_is_refused_and_nothing_is_written(tmp_path, content):
    src = tmp_path / "empty.jsonl"
    src.write_text(content, encoding="utf-8")
    out = tmp_path / "tok4" / "tokenizer.json"
    done = minilmd("tokenizer", "train", str(src), "--vocab-size", "6400", "--out", str(out))
    assert done.returncode == 65, done.stderr
    assert done.stderr.startswith(f"error: {src}: no documents"), done.stderr
    assert "warning" not in done.stderr and not out.parent.exists()


def test_every_bad_line_is_named_in_the_words_prepare_uses(tmp_path, tokenizer):
    src = plain_text(tmp_path / "wrong.jsonl", 3, good=2)
    trained = minilmd("tokenizer", "train", str(src), "--out", str(tmp_path / "tok" / "tokenizer.json"))
    prepared = minilmd("prepare", str(src), "--tokenizer", str(tokenizer), "--out", str(tmp_path / "prep"),
                       "--workers", "0")
    assert (trained.returncode, prepared.returncode) == (65, 65), (trained.stderr, prepared.stderr)
    named = [line for line in trained.stderr.splitlines() if line.startswith(f"{src}:")]
    assert [line.split(":")[1] for line in named] == ["1", "2", "3"], trained.stderr
    assert named == [line for line in prepared.stderr.splitlines() if line.startswith(f"{src}:")]
    said = [line for line in prepared.stderr.splitlines() if line.startswith("error:")]
    assert trained.stderr.splitlines()[0] == said[0], (trained.stderr, prepared.stderr)
    assert "3 bad lines (invalid json: 3)" in trained.stderr
    assert not (tmp_path / "tok").exists()


def test_many_bad_lines_the_first_twenty_named_then_their_number(tmp_path):
    src = plain_text(tmp_path / "wrong.jsonl", 45)
    done = minilmd("tokenizer", "train", str(src), "--out", str(tmp_path / "tokenizer.json"))
    assert done.returncode == 65, done.stderr
    named = [line for line in done.stderr.splitlines() if line.startswith(f"{src}:")]
    assert len(named) == 20 and named[0].startswith(f"{src}:1: invalid json"), done.stderr
    assert "... and 25 more: 45 in all" in done.stderr


def test_skipped_bad_lines_are_named_as_prepare_names_them(tmp_path):
    src = plain_text(tmp_path / "mixed.jsonl", 2, good=30)
    out = tmp_path / "tokenizer.json"
    done = minilmd("tokenizer", "train", str(src), "--out", str(out), "--vocab-size", "300", "--on-bad-line", "skip")
    assert done.returncode == 0 and out.exists(), done.stderr
    assert "bad lines skipped by this run (invalid json: 2):" in done.stderr
    assert f"  {src}:2: invalid json" in done.stderr
