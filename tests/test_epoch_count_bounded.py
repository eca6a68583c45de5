"""Padding-free SFT's epoch count on a corpus someone else wrote (hostile audit 9 F3): a teammate's meta.json may
list 25 M documents of two tokens, with a 100 MB index and sparse token files; `run --check` (and a resumed run's
done line, a stage's update share) counted the epoch by reading every length into one int64 array and packing them
into a Python list of rows: 1.6 GB and 13.5 s for the victim. Now the lengths are counted by row length, a chunk at a
time (format.doc_length_counts), the rows from those counts (docpacking.packed_row_count: no document held), and a
meta.json that lists more than train's tokens.bin can hold is not read on (the epoch is then "not counted")."""
from __future__ import annotations

import os
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from minilmd.plan.docpacking import packed_row_count, packed_rows
from minilmd.plan.epoch import corpus_epoch

SEQ_LEN = 512


def _cfg(root: Path) -> SimpleNamespace:
    return SimpleNamespace(data=SimpleNamespace(mode="packed", doc_mask=True, prepared=str(root)),
                           train=SimpleNamespace(seq_len=SEQ_LEN, micro_batch_size=4, seed=0))


def _his_corpus(tmp_path: Path, lengths: np.ndarray, token_bytes: int) -> tuple[Path, dict]:
    """A chat corpus's train split as the teammate writes it: the index `lengths`, sparse tokens.bin and
    loss_mask.bin of `token_bytes` and half of it; (its directory, its meta.json)."""
    root = tmp_path / "his"
    (root / "train").mkdir(parents=True)
    np.save(root / "train" / "doc_lengths.npy", lengths.astype("<i4"))
    for name, size in (("tokens.bin", token_bytes), ("loss_mask.bin", token_bytes // 2)):
        with open(root / "train" / name, "wb") as f:
            f.truncate(size)
    meta = {"data_format": "chat", "splits": {"train": {"documents": int(lengths.size),
                                                        "tokens": int(lengths.sum(dtype=np.int64))}}}
    return root, meta


def _peak(fn):
    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_teammates_index_of_millions_of_documents_is_counted_in_a_chunks_memory(tmp_path):
    documents = 2 << 20  # 8 MiB of index: before, about 65 bytes a document (130 MiB) were held to count it
    lengths = np.full(documents, 2, np.int32)
    lengths[::1000] = 300  # a few long ones: rows of two kinds
    root, meta = _his_corpus(tmp_path, lengths, 2 * int(lengths.sum(dtype=np.int64)))
    epoch, peak = _peak(lambda: corpus_epoch(_cfg(root), meta))
    index_size = (root / "train" / "doc_lengths.npy").stat().st_size
    assert epoch is not None and epoch.kind == "conversations" and epoch.documents == documents
    assert peak < index_size // 4, (peak, index_size)  # a chunk and its temporaries (about 2 MiB), generously
    long_docs = documents // 1000 + 1  # each starts a row, with (512 - 300) / 2 short ones; 256 short ones a row after
    short_left = documents - long_docs - long_docs * 106
    assert epoch.rows == long_docs + -(-short_left // 256), epoch  # the packer's count (the test below: the same)


def test_a_meta_json_listing_more_than_tokens_bin_holds_is_not_read_on(tmp_path):
    lengths = np.full(1 << 20, 2, np.int32)
    root, meta = _his_corpus(tmp_path, lengths, 2 * int(lengths.sum()))
    with open(root / "train" / "tokens.bin", "r+b") as f:  # tokens.bin holds a tenth of what meta.json lists
        f.truncate(os.path.getsize(root / "train" / "tokens.bin") // 10)
    epoch, peak = _peak(lambda: corpus_epoch(_cfg(root), meta))
    assert epoch is None and peak < 1 << 20, peak  # not counted, and nothing of the index read
    meta["splits"]["train"]["documents"] = meta["splits"]["train"]["tokens"] + 1  # a document is a token at least
    assert corpus_epoch(_cfg(tmp_path / "nowhere"), meta) is None


@pytest.mark.parametrize("seed", range(6))
def test_the_count_from_length_counts_is_the_packers_row_count(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        seq_len = int(rng.integers(3, 300))
        picks = [rng.integers(1, seq_len + 1, 500), np.minimum(rng.geometric(0.03, 500), seq_len),
                 rng.choice([1, 2, seq_len // 3 + 1, seq_len // 2, seq_len], 500)]
        for lengths in picks:
            lengths = lengths[: int(rng.integers(0, 500))]
            counts = np.bincount(lengths, minlength=seq_len + 1)
            assert packed_row_count(counts, seq_len) == len(packed_rows(lengths, seq_len, seed)), (seq_len, lengths)
