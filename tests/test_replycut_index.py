"""`run --check`'s reply count reads a chat corpus's doc_lengths.npy as the corpus format writes it
(minilmd/doc_index.py, minilmd/replycut.py): int32, at least the documents meta.json lists, of the size its header
gives, checked before any length is read, then streamed in chunks. Before (hostile8 F3): any integer dtype up to 1 GiB
was read whole and widened to int64 (a teammate's 96 MiB of int8 zeros cost `run --check` and the supervisor 0.9 GB),
and a corpus in the middle of a `prepare --append` (its mask grown before meta.json) was refused as files that lie."""
from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from chat_helpers import prepared_chat, read_conversations, write_jsonl
from minilmd import doc_index, reply_check
from minilmd.config import load_config
from minilmd.probes import path_problems
from minilmd.replycut import CorpusLies, chat_replies_cut, row_targets, tally
from trainer_corpus import write_config

PREPARED_AT = 96


@pytest.fixture(scope="module")
def corpus(chat_jsonl, chat_tokenizer, tmp_path_factory) -> tuple[Path, int]:
    """(root, vocabulary) of 150 real conversations prepared at --seq-len 96."""
    out = tmp_path_factory.mktemp("idx96")
    lines = [{"conversations": c} for c in read_conversations(chat_jsonl)[:150]]
    root = prepared_chat([write_jsonl(out / "c.jsonl", lines)], chat_tokenizer, out / "corpus", seq_len=PREPARED_AT,
                         val_fraction=0.1)
    return root, json.loads((root / "meta.json").read_text(encoding="utf-8"))["vocab_size"]


def _listed(root: Path, split: str = "train") -> dict:
    return json.loads((root / "meta.json").read_text(encoding="utf-8"))["splits"][split]


def _copy(tmp_path: Path, corpus, name: str) -> Path:
    copy = tmp_path / name
    shutil.copytree(corpus[0], copy)
    return copy


def _old_count(split: Path, seq_len: int, targets: int, limit: int):
    """The count before doc_index (replycut.py at 9a53092, its checks left out): the index read whole, widened."""
    lengths = np.load(split / "doc_lengths.npy").astype(np.int64)
    mask_all = np.fromfile(split / "loss_mask.bin", np.uint8)
    starts = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    long_docs = np.flatnonzero(lengths > seq_len)
    read = long_docs
    if long_docs.size > limit:
        read = long_docs[np.linspace(0, long_docs.size - 1, limit).astype(np.int64)]
    kept, lost = np.zeros(read.size, np.int64), np.zeros(read.size, np.int64)
    for i, d in enumerate(read.tolist()):
        n = int(lengths[d])
        (kept[i],), (lost[i],) = row_targets(mask_all[starts[d]:starts[d] + n], np.array([0, n]), seq_len)
    return tally(kept, lost, int(lengths.size), targets, long_docs.size / read.size if read.size else 1.0)


@pytest.mark.parametrize("chunk", [7, 64, doc_index.CHUNK_DOCS])
def test_the_streamed_count_is_the_old_whole_index_count(corpus, monkeypatch, chunk):
    """Chunk boundaries anywhere (7 documents a chunk: many long documents straddle one) change no count, sampled
    or not."""
    root = corpus[0]
    monkeypatch.setattr(doc_index, "CHUNK_DOCS", chunk)
    lengths = np.load(root / "train" / "doc_lengths.npy")
    seq_lens = sorted({int(np.percentile(lengths, q)) for q in (10, 50, 90)} | {PREPARED_AT})
    for split in ("train", "val"):
        listed = _listed(root, split)
        for seq_len in seq_lens:
            for limit in (3, 10, 4096):
                new = chat_replies_cut(root / split, seq_len, listed, PREPARED_AT, limit=limit)
                assert new == _old_count(root / split, seq_len, listed["target_tokens"], limit), (split, seq_len)
    assert chat_replies_cut(root / "train", seq_lens[0], _listed(root), PREPARED_AT, limit=3).sampled


@pytest.mark.parametrize("lie", ["int8", "int64", "uint32", "fewer", "trailing", "truncated"])
def test_an_index_not_as_prepare_writes_it_is_refused_naming_the_file(tmp_path, corpus, monkeypatch, lie):
    """Another dtype (a byte a document, widened 8 times before; int64 with the true lengths), fewer lengths than
    meta.json lists, bytes its header does not give: refused before a length is read, naming the file and what
    disagrees. A truncated one (a copy not finished) is not read now (OSError: the trainer counts at its start)."""
    monkeypatch.setattr(reply_check, "_verdicts", {})
    root = _copy(tmp_path, corpus, lie)
    index = root / "train" / "doc_lengths.npy"
    true = np.load(index)
    if lie in ("int8", "int64", "uint32"):
        np.save(index, np.zeros(true.size * 8, np.int8) if lie == "int8" else true.astype(lie))
        words = rf"holds {np.dtype(lie)} of shape .*not the 1-D int32 \(little-endian\) lengths"
    elif lie == "fewer":
        np.save(index, true[:-1])
        words = rf"{true.size - 1:,} document lengths, fewer than the {true.size:,} documents its meta.json counts"
    else:
        data = index.read_bytes()
        index.write_bytes(data + bytes(3) if lie == "trailing" else data[:-3])
        words = r"bytes, but its header gives"
    with pytest.raises(OSError if lie == "truncated" else CorpusLies, match=words) as e:
        chat_replies_cut(root / "train", 40, _listed(root), PREPARED_AT)
    assert str(index) in str(e.value)
    problems = path_problems(load_config(write_config(tmp_path, (root, corpus[1]), name=lie,
                                                      train={"seq_len": 40})))
    said = [p for p in problems if "doc_lengths.npy" in p and "not a corpus the trainer can read" in p]
    assert bool(said) == (lie != "truncated"), problems


def test_the_count_reads_a_large_index_in_bounded_memory(tmp_path):
    """2 M documents (an 8 MiB index): the old count held it widened twice over (lengths and starts as int64, 32 MiB
    and more, 40 MiB); the streamed one a chunk at a time (about 2 MiB, whatever the index's size). The bound is
    generous: half the index's own size."""
    split = tmp_path / "train"
    split.mkdir()
    lengths = np.full(2_000_000, 2, np.int32)
    lengths[::1000] = 50  # 2,000 long documents, all read: the second pass runs too
    np.save(split / "doc_lengths.npy", lengths)
    mask = np.zeros(int(lengths.sum()), np.uint8)
    mask[np.cumsum(lengths) - 1] = 1
    mask.tofile(split / "loss_mask.bin")
    listed = {"documents": lengths.size, "tokens": int(lengths.sum()), "target_tokens": int(mask.sum())}
    tracemalloc.start()
    try:
        cut = chat_replies_cut(split, 40, listed, 64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (cut.items, cut.targets_lost, cut.sampled) == (lengths.size, 2000, False)
    assert peak < (split / "doc_lengths.npy").stat().st_size // 2, peak


def test_run_check_in_the_middle_of_an_append_counts_what_meta_json_describes(tmp_path, corpus, chat_jsonl,
                                                                             monkeypatch):
    """A real `prepare --append`, stopped at each of its steps (docs/formats.md): the tails of tokens.bin and
    loss_mask.bin written, then the longer doc_lengths.npy renamed in, meta.json not yet; `run --check`'s problems
    asked there. The corpus meta.json describes is the old one, whole: the count reads that prefix, as the trainer
    and staging do, and finds what it found before. Before: refused as files that lie ("counts N tokens but
    loss_mask.bin holds M ... not a corpus the trainer can read") until meta.json was written."""
    from minilmd.corpus.prepare import append as append_mod
    from minilmd.dirfd import Dir

    root = _copy(tmp_path, corpus, "appending")
    cfg = load_config(write_config(tmp_path, (root, corpus[1]), name="appending", train={"seq_len": 40}))
    before = {split: chat_replies_cut(root / split, 40, _listed(root, split), PREPARED_AT)
              for split in ("train", "val")}
    seen: dict[str, tuple] = {}

    def check(step: str) -> None:
        monkeypatch.setattr(reply_check, "_verdicts", {})
        problems = path_problems(cfg)
        counts = {split: chat_replies_cut(root / split, 40, _listed(root, split), PREPARED_AT) for split in before}
        seen[step] = (problems, counts, (root / "train" / "loss_mask.bin").stat().st_size)

    real_new_meta, real_write = append_mod._new_meta, Dir.write_atomic

    def new_meta(*a, **k):  # both splits' tails written, their longer indexes not yet renamed in
        check("tails written")
        return real_new_meta(*a, **k)

    def write_atomic(self, name, *a, **k):
        if name == "meta.json" and "index renamed in" not in seen:
            check("index renamed in")
        return real_write(self, name, *a, **k)

    monkeypatch.setattr(append_mod, "_new_meta", new_meta)
    monkeypatch.setattr(Dir, "write_atomic", write_atomic)
    listed_mask = json.loads((root / "meta.json").read_text(encoding="utf-8"))["files"]["train/loss_mask.bin"]["size"]
    more = [{"conversations": c} for c in read_conversations(chat_jsonl)[150:230]]
    append_mod.append([str(write_jsonl(tmp_path / "more.jsonl", more))], root, workers=0, log=lambda m: None)
    assert set(seen) == {"tails written", "index renamed in"}
    for step, (problems, counts, mask_size) in seen.items():
        assert mask_size > listed_mask, step  # the append was caught in the middle
        assert problems == [] and counts == before, (step, problems)
