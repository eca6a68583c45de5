"""`minilmd prepare` of a corpus in more shards than a process may hold open at once (`prepare data/*.jsonl` over a
sharded dataset: thousands of files, under the usual soft limit of 1,024 open files). Before, every source was
opened up front and held open for the whole read (its Collector used the open sources): "cannot open ([Errno 24]
Too many open files)", exit 74. Now each is opened, checked and measured up front and closed
(minilmd/corpus/sources/source_list.py, as tokenizer train's), then read one at a time: a missing one still fails
first, with nothing written. The limit is set low (128) in the child alone, over 200 tiny shards; every format
(text, chat, dpo) and `--append` take the one path (minilmd/corpus/prepare/stream.py)."""
from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from chat_helpers import HAND_MADE, a, u
from chat_helpers import write_jsonl as write_objects
from data_helpers import no_leftovers, write_jsonl
from minilmd.corpus.format import open_prepared
from minilmd.protocol import EXIT_CONFIG, EXIT_IO

CLI = [sys.executable, "-m", "minilmd.cli"]
SHARDS = 200
OPEN_FILES = 128  # fewer than the shards: holding them all at once cannot work


def _few_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def _prepare(args: list, limited: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "prepare", *map(str, args), "--workers", "2"], capture_output=True, text=True,
                          timeout=600, preexec_fn=_few_open_files if limited else None)


def _text_shards(folder: Path, first: int = 0) -> list[Path]:
    folder.mkdir(exist_ok=True)
    return [write_jsonl(folder / f"part-{i:04d}.jsonl", [f"shard {i}: some words {i * 7} and more {i % 13}"])
            for i in range(first, first + SHARDS)]


def test_prepare_reads_more_shards_than_it_may_hold_open_at_once(tmp_path, tokenizer):
    shards = _text_shards(tmp_path / "data")
    out = tmp_path / "corpus"
    done = _prepare([*shards, "--tokenizer", tokenizer, "--out", out, "--val-fraction", "0.1"])
    assert done.returncode == 0, done.stderr  # before: exit 74, "cannot open ([Errno 24] Too many open files)"
    meta = json.loads((out / "meta.json").read_text())
    assert [s["path"] for s in meta["sources"]] == [str(p) for p in shards]
    assert [(s["bytes"], s["documents"]) for s in meta["sources"]] == [(p.stat().st_size, 1) for p in shards]
    more = _text_shards(tmp_path / "more", first=SHARDS)
    appended = _prepare([*more, "--append", "--out", out])
    assert appended.returncode == 0, appended.stderr
    assert open_prepared(out).meta["versions"][-1]["sources"] == [str(p) for p in more]


def test_a_missing_shard_among_many_still_fails_first_with_nothing_written(tmp_path, tokenizer):
    """Every shard is checked before any is read: the one mistyped at the end is named at once (exit 2), not after
    the others were read, and nothing is written. Shard 0 is a .gz that is no gzip, which opens (its stream is read
    lazily) but fails when read (exit 74): read before the last was checked, it would end the prepare first."""
    shards = _text_shards(tmp_path / "data")
    shards[0] = tmp_path / "data" / "part-0000.jsonl.gz"
    shards[0].write_bytes(b"not gzip at all\n")
    typo = tmp_path / "data" / "part-tpyo.jsonl"
    done = _prepare([*shards, typo, "--tokenizer", tokenizer, "--out", tmp_path / "corpus"])
    assert done.returncode == EXIT_CONFIG, done.stderr  # not shard 0's read failure (74)
    assert done.stderr.strip() == f"error: {typo}: no such file", done.stderr
    assert no_leftovers(tmp_path / "corpus")
    alone = _prepare([shards[0], "--tokenizer", tokenizer, "--out", tmp_path / "corpus"])
    assert alone.returncode == EXIT_IO and "part-0000.jsonl.gz: read failed" in alone.stderr, alone.stderr


@pytest.mark.parametrize("data_format", ["chat", "dpo"])
def test_chat_and_preference_prepares_read_more_shards_than_they_may_hold_open(tmp_path, chat_tokenizer,
                                                                               data_format):
    folder = tmp_path / "data"
    shards = []
    for i in range(SHARDS):
        conversation = [*HAND_MADE[i % len(HAND_MADE)][:-1], a(f"reply {i}")]
        line = {"conversations": conversation} if data_format == "chat" else {
            "chosen": [u(f"question {i}"), a(f"the right answer {i}")],
            "rejected": [u(f"question {i}"), a(f"a wrong one {i * 3}")]}
        shards.append(write_objects(folder / f"part-{i:04d}.jsonl", [line]))
    out = tmp_path / "corpus"
    done = _prepare([*shards, "--tokenizer", chat_tokenizer, "--out", out, "--format", data_format,
                     "--val-fraction", "0", "--seq-len", "512"])
    assert done.returncode == 0, done.stderr  # before: exit 74, "Too many open files"
    corpus = open_prepared(out)
    assert corpus.data_format == data_format
    assert corpus.train.n_docs == SHARDS * (2 if data_format == "dpo" else 1)
    assert [s["documents"] for s in corpus.meta["sources"]] == [2 if data_format == "dpo" else 1] * SHARDS
