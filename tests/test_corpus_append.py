"""`prepare --append` (minilmd/corpus/prepare/append.py): only the new lines are encoded, the result is byte-identical
to a
full prepare of the concatenated input except for the one documented case (a new train document repeating an old
val one), the version chain, and readers that see the old version or the new one at every moment of an append."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os

import numpy as np
import pytest

from data_helpers import read_texts, write_jsonl
from minilmd.corpus.format import open_prepared
from minilmd.corpus.prepare.append import append
from minilmd.corpus.prepare.pipeline import prepare, split_is_val
from minilmd.corpus.sources.jsonl import InputError

VF = 0.05
SPLIT_FILES = ("train/tokens.bin", "train/doc_lengths.npy", "val/tokens.bin", "val/doc_lengths.npy")


def _prepare(paths, tokenizer, out):
    return prepare([str(p) for p in paths], tokenizer, out, val_fraction=VF, workers=0, progress=False,
                   log=lambda m: None)


def _same_files(a, b) -> list[str]:
    return [f for f in SPLIT_FILES if (a / f).read_bytes() != (b / f).read_bytes()]


@pytest.fixture
def texts(demo_jsonl):
    return read_texts(demo_jsonl)[:300]


@pytest.mark.slow  # four prepares and two appends
def test_append_is_a_full_prepare_of_the_concatenation(tmp_path, texts, tokenizer):
    old, new = texts[:200], texts[200:]
    old_val = next(t for t in old if split_is_val(t, VF))
    old_train = next(t for t in old if not split_is_val(t, VF))
    # a whitespace variant of an old train document that the split rule sends to val: a leak in both ways
    leak = next(v for v in (old_train + " " * k for k in range(1, 400)) if split_is_val(v, VF))
    new = [*new, leak, old_train]  # and an exact duplicate (train, like its original)
    a = write_jsonl(tmp_path / "a.jsonl", old)
    b = write_jsonl(tmp_path / "b.jsonl", new)
    with open(b, "a") as f:
        f.write("\n")  # a blank line: counted, not a document
    both = write_jsonl(tmp_path / "ab.jsonl", old + new)
    root = tmp_path / "corpus"
    _prepare([a], tokenizer, root)
    before = (root / "meta.json").read_bytes()
    reader = open_prepared(root)  # a trainer that has the old version open keeps reading the same prefix
    old_train_tokens = np.array(reader.train.tokens)

    meta = append([str(b)], root, workers=0, progress=False, log=lambda m: None)
    full = _prepare([both], tokenizer, tmp_path / "full")
    assert _same_files(root, tmp_path / "full") == []
    assert meta["splits"] == full["splits"]
    v1, v2 = meta["versions"]
    assert (v1["version"], v1["documents"], v2["version"]) == (1, 200, 2)
    assert v2["previous_meta_sha256"] == hashlib.sha256(before).hexdigest()
    assert v2["documents_added"] == len(new) - 1 and v2["leaked_val_removed"] == 1
    src = meta["sources"][-1]
    assert src["lines"] == src["documents"] + src["blank_lines"] + src["bad_lines"] == len(new) + 1
    assert np.array_equal(np.asarray(reader.train.tokens), old_train_tokens)
    assert open_prepared(root, verify_hash=True).train.n_docs == full["splits"]["train"]["documents"]

    # the one difference: a new train document that repeats an old val one is left out of train; a full prepare
    # keeps it and removes the old val document instead
    variant = next(v for v in (old_val + " " * k for k in range(1, 400)) if not split_is_val(v, VF))
    c = write_jsonl(tmp_path / "c.jsonl", [variant])
    v2_meta = (root / "meta.json").read_bytes()
    with pytest.raises(InputError, match="no documents"):  # the one document is left out: nothing to append
        append([str(c)], root, workers=0, progress=False, log=lambda m: None)
    assert (root / "meta.json").read_bytes() == v2_meta
    c = write_jsonl(tmp_path / "c.jsonl", [variant, "一个全新的句子，用来追加。"])
    meta3 = append([str(c)], root, workers=0, progress=False, log=lambda m: None)
    assert meta3["versions"][-1]["train_repeating_old_val_dropped"] == 1
    full3 = _prepare([both, c], tokenizer, tmp_path / "full3")
    assert full3["splits"]["train"]["documents"] == meta3["splits"]["train"]["documents"] + 1
    assert full3["splits"]["val"]["documents"] == meta3["splits"]["val"]["documents"] - 1


def test_a_reader_sees_one_version_at_every_step(tmp_path, texts, tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", texts[:150])
    b = write_jsonl(tmp_path / "b.jsonl", texts[150:])
    root = tmp_path / "corpus"
    _prepare([a], tokenizer, root)
    v1 = {f: (root / f).read_bytes() for f in SPLIT_FILES}
    # after step 1 (the tail written) and between the renames of step 3 (doc_lengths.npy already longer): the
    # old meta.json still describes a complete version, and that is what a reader gets
    with open(root / "train" / "tokens.bin", "ab") as f:
        f.write(b"\x07\x00" * 1000)  # also what an interrupted append leaves behind
    lengths = np.load(root / "train" / "doc_lengths.npy")
    np.save(root / "train" / "doc_lengths.npy", np.concatenate([lengths, [1000]]).astype(np.int32))
    c = open_prepared(root, verify_hash=True)
    assert c.train.n_docs == lengths.size and c.train.n_tokens * 2 == len(v1["train/tokens.bin"])
    np.save(root / "train" / "doc_lengths.npy", lengths)

    stray = root / "train" / "doc_lengths.npy.append-999999.npy"  # an append killed before its renames
    np.save(stray, lengths)
    fd = os.open(tmp_path / "corpus.lock", os.O_RDWR | os.O_CREAT)  # an append running on it holds this lock
    fcntl.flock(fd, fcntl.LOCK_EX)
    with pytest.raises(ValueError, match="another prepare is writing it"):
        append([str(b)], root, workers=0, progress=False, log=lambda m: None)
    os.close(fd)
    append([str(b)], root, workers=0, progress=False, log=lambda m: None)  # cuts the stale tail first
    assert not stray.exists()
    full = tmp_path / "full"
    _prepare([write_jsonl(tmp_path / "ab.jsonl", texts)], tokenizer, full)
    assert _same_files(root, full) == []
    for f in ("train/tokens.bin", "val/tokens.bin"):
        assert (root / f).read_bytes()[:len(v1[f])] == v1[f]


@pytest.mark.slow
def test_append_to_a_chat_corpus(tmp_path, chat_jsonl, chat_tokenizer):
    def chat_prepare(paths, out):
        return prepare([str(p) for p in paths], chat_tokenizer, out, val_fraction=0.1, workers=0, progress=False,
                       log=lambda m: None, data_format="chat", seq_len=128)

    lines = [ln for p in chat_jsonl for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[300:]) + "\n", encoding="utf-8")
    (tmp_path / "ab.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    root = tmp_path / "corpus"
    chat_prepare([tmp_path / "a.jsonl"], root)
    meta = append([str(tmp_path / "b.jsonl")], root, workers=0, progress=False, log=lambda m: None)
    full = chat_prepare([tmp_path / "ab.jsonl"], tmp_path / "full")
    files = [*SPLIT_FILES, "train/loss_mask.bin", "val/loss_mask.bin"]
    assert [f for f in files if (root / f).read_bytes() != (tmp_path / "full" / f).read_bytes()] == []
    assert meta["splits"] == full["splits"]  # target tokens included
    for split in ("train", "val"):
        assert meta["stats"][split] == full["stats"][split], split
    assert {k: meta["chat"][k] for k in ("cut", "dropped_long")} == {k: full["chat"][k] for k in ("cut",
                                                                                                 "dropped_long")}
    assert open_prepared(root, verify_hash=True).train.target_tokens == full["splits"]["train"]["target_tokens"]


def test_bench_append_side_by_side(tmp_path, texts, tokenizer):
    from minilmd.corpus.bench.append import bench_append

    old = write_jsonl(tmp_path / "old.jsonl", texts[:250])
    new = write_jsonl(tmp_path / "new.jsonl", texts[250:])
    lines = []
    r = bench_append(str(tokenizer), str(old), str(new), workers=0, scratch=str(tmp_path), log=lines.append,
                     val_fraction=VF)
    assert r["differing_files"] == [] and "byte-identical" in lines[-1]
    # the append writes only the new documents (and doc_lengths.npy again); the full prepare writes everything
    assert 0 < r["append"]["peak_disk_bytes"] < r["full"]["peak_disk_bytes"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("minilmd-bench")] == []


def test_cli_append_refuses_other_rules_and_counts_its_lines(tmp_path, texts, tokenizer):
    from typer.testing import CliRunner

    from minilmd.cli import app

    root = tmp_path / "corpus"
    _prepare([write_jsonl(tmp_path / "a.jsonl", texts[:100])], tokenizer, root)
    new = write_jsonl(tmp_path / "b.jsonl", texts[100:120])
    runner = CliRunner()
    bad = runner.invoke(app, ["prepare", "--append", str(new), "--out", str(root), "--tokenizer", str(tokenizer)])
    assert bad.exit_code == 2 and "own tokenizer" in bad.output
    ok = runner.invoke(app, ["prepare", "--append", str(new), "--out", str(root), "--workers", "0"])
    assert ok.exit_code == 0, ok.output
    meta = json.loads((root / "meta.json").read_text())
    assert meta["versions"][-1]["sources"] == [str(new)] and meta["sources"][-1]["lines"] == 20
    assert sum(meta["splits"][s]["documents"] for s in ("train", "val")) == 120
