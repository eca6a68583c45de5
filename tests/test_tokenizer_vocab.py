"""`minilmd tokenizer train --vocab-size N` on a corpus too small for N: the vocabulary it really has is said
loudly, with both numbers and what they mean for the run config, and the final line records the real size."""
from __future__ import annotations

import subprocess
import sys

from data_helpers import write_jsonl
from minilmd.corpus.tokenizer import load_tokenizer

TWENTY = [f"第{i}篇：今天天气很好，我们去公园散步。" for i in range(20)]


def train(tmp_path, vocab_size: int) -> tuple[subprocess.CompletedProcess, int]:
    src = write_jsonl(tmp_path / "small.jsonl", TWENTY)
    out = tmp_path / f"tok-{vocab_size}.json"
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "tokenizer", "train", str(src), "--vocab-size",
                           str(vocab_size), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done, load_tokenizer(out).get_vocab_size(with_added_tokens=True)


def test_a_vocabulary_smaller_than_asked_is_warned_about_with_both_numbers(tmp_path):
    done, actual = train(tmp_path, 6400)
    assert actual < 6400
    warning = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1, done.stderr
    assert f"--vocab-size 6400 but the corpus gave only {actual} entries" in warning[0]
    assert f"needs model.vocab_size = {actual}" in warning[0]
    assert f"vocabulary of {actual} (asked for 6400)" in done.stdout


def test_no_warning_when_the_corpus_fills_the_vocabulary(tmp_path):
    done, actual = train(tmp_path, 300)
    assert actual == 300
    assert "warning" not in done.stderr and "asked for" not in done.stdout
