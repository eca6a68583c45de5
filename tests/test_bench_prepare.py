"""`minilmd bench prepare` runs end to end and prints both sides ([A]). Figures are measured, never asserted."""
from __future__ import annotations

import subprocess
import sys

import pytest

from minilmd.corpus.demo_text import write_repeated_corpus


@pytest.mark.slow
def test_bench_prepare_prints_raw_and_prepare_side_by_side(tmp_path, demo_jsonl, tokenizer):
    big = write_repeated_corpus(demo_jsonl, tmp_path / "big.jsonl", target_mb=0.5)
    assert 0.5e6 <= big.stat().st_size < 0.6e6
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "bench", "prepare", str(big), "--tokenizer",
                           str(tokenizer), "--workers", "1", "--scratch", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for needle in ("raw encode_batch", "raw encode_batch_fast", "prepare (1 workers, wall)", "text MB/s",
                   "tokens/s", "prepare / fastest raw encode:", "peak RSS of prepare and its workers:"):
        assert needle in out, out
    assert not list(tmp_path.glob("minilmd-bench-prepare-*")), "the bench removes its prepared output"


def test_repeated_corpus_varies_documents(tmp_path, demo_jsonl):
    big = write_repeated_corpus(demo_jsonl, tmp_path / "big.jsonl", target_mb=0.2)
    lines = big.read_text(encoding="utf-8").splitlines()
    assert len(lines) > 100
    assert len(set(lines)) > 0.9 * len(lines), "repetitions are varied, not copies"


@pytest.mark.slow
def test_bench_prepare_chat_prints_the_floor_and_prepare_side_by_side(tmp_path, demo_jsonl, chat_tokenizer):
    from minilmd.corpus.demo_text import write_repeated_chat_corpus

    chat = write_repeated_chat_corpus(demo_jsonl, tmp_path / "chat.jsonl", target_mb=1.0)
    lines = chat.read_text(encoding="utf-8").splitlines()
    assert len(set(lines)) == len(lines) > 500
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "bench", "prepare", str(chat), "--tokenizer",
                           str(chat_tokenizer / "tokenizer.json"), "--format", "chat", "--seq-len", "1024",
                           "--workers", "1", "--scratch", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for needle in ("floor: render once + encode_batch", "the same, one thread", "prepare --format chat (1 workers)",
                   "JSONL MB/CPU-s", "prepare/this",
                   "chat prepare / its floor:", f"{len(lines):,} conversations"):
        assert needle in done.stdout, done.stdout
    assert not list(tmp_path.glob("minilmd-bench-prepare-*")), "the bench removes its prepared output"
