"""TokenStream and PreparedCorpus: the checks every open makes, and verify_prepared ([A], issue 2)."""
from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from data_helpers import write_jsonl
from minilmd.corpus.format import TokenStream, open_prepared, verify_prepared
from minilmd.corpus.prepare.pipeline import prepare
from minilmd.corpus_meta import CorpusError


@pytest.fixture(scope="module")
def made(tmp_path_factory, demo_jsonl, tokenizer):
    """Two prepared corpora from different texts with the same tokenizer: A (demo slice) and B (other docs)."""
    root = tmp_path_factory.mktemp("ts")
    other = write_jsonl(root / "other.jsonl", [f"另一个语料的第{i}篇文档。" * (1 + i % 5) for i in range(150)])
    prepare(demo_jsonl, tokenizer, root / "A", val_fraction=0.1, workers=0, progress=False, log=lambda m: None)
    prepare([str(other)], tokenizer, root / "B", val_fraction=0.1, workers=0, progress=False, log=lambda m: None)
    return root


@pytest.fixture
def a_copy(made, tmp_path):
    shutil.copytree(made / "A", tmp_path / "A")
    return tmp_path / "A"


def test_open_prepared_exposes_the_agreed_attributes(made):
    pc = open_prepared(made / "A", verify_hash=True)
    meta = json.loads((made / "A" / "meta.json").read_text())
    assert pc.meta == meta and pc.root == made / "A" and pc.vocab_size == meta["vocab_size"]
    for stream, split in ((pc.train, "train"), (pc.val, "val")):
        assert stream.tokens.dtype == np.uint16 and stream.tokens.ndim == 1
        assert stream.doc_lengths.dtype == np.int64 and stream.doc_starts.dtype == np.int64
        assert stream.doc_starts[0] == 0 and len(stream.doc_starts) == stream.n_docs + 1
        assert stream.doc_starts[-1] == stream.n_tokens == meta["splits"][split]["tokens"]
    assert pc.tokenizer_fingerprint == hashlib.sha256(pc.tokenizer_path.read_bytes()).hexdigest()
    pairs = sorted((p, f["sha256"]) for p, f in meta["files"].items() if p.startswith(("train/", "val/")))
    assert pc.data_fingerprint == hashlib.sha256("".join(f"{p}\0{h}\n" for p, h in pairs).encode()).hexdigest()
    assert pc.data_fingerprint != open_prepared(made / "B").data_fingerprint
    assert verify_prepared(made / "A") == []


def test_tokens_and_doc_lengths_of_different_runs_are_refused_naming_both_numbers(made, tmp_path):
    split = tmp_path / "train"  # outside a corpus dir: no meta.json, only the invariant can catch it
    split.mkdir()
    shutil.copy(made / "A" / "train" / "tokens.bin", split / "tokens.bin")
    shutil.copy(made / "B" / "train" / "doc_lengths.npy", split / "doc_lengths.npy")
    n_tokens = (made / "A" / "train" / "tokens.bin").stat().st_size // 2
    n_lengths = int(np.load(made / "B" / "train" / "doc_lengths.npy").sum())
    assert n_tokens != n_lengths
    with pytest.raises(CorpusError) as e:
        TokenStream(split)
    msg = str(e.value)
    assert f"{n_tokens} tokens" in msg and f"sums to {n_lengths}" in msg
    assert "they did not come from the same run" in msg


def test_same_total_but_shifted_boundaries_are_refused(made, tmp_path):
    split = tmp_path / "train"
    split.mkdir()
    shutil.copy(made / "A" / "train" / "tokens.bin", split / "tokens.bin")
    lengths = np.load(made / "A" / "train" / "doc_lengths.npy")
    assert lengths[0] != lengths[1]
    np.save(split / "doc_lengths.npy", np.concatenate([lengths[1::-1], lengths[2:]]))  # same sum
    with pytest.raises(CorpusError, match="document 0 .*expected BOS 1 ... EOS 2: they did not come from the same"):
        TokenStream(split)


def test_size_recorded_in_meta_is_checked_on_every_open(a_copy, made):
    shutil.copy(made / "B" / "val" / "tokens.bin", a_copy / "val" / "tokens.bin")
    with pytest.raises(CorpusError, match="bytes, meta.json says .*did not come from the same run"):
        open_prepared(a_copy)


def test_ids_at_or_above_the_vocabulary_are_refused(made):
    top = int(np.asarray(TokenStream(made / "A" / "train").tokens).max())
    TokenStream(made / "A" / "train", vocab_size=top + 1)
    with pytest.raises(CorpusError, match=f"holds token id {top} but the vocabulary has {top} ids"):
        TokenStream(made / "A" / "train", vocab_size=top)


def test_full_hash_is_optional_on_open_and_always_in_verify_prepared(a_copy):
    path = a_copy / "train" / "tokens.bin"
    data = bytearray(path.read_bytes())
    lengths = np.load(a_copy / "train" / "doc_lengths.npy")
    i = 2 * 1  # second token of the first document: a body token, replaced by another valid id
    assert lengths[0] > 2
    data[i:i + 2] = (int.from_bytes(data[i:i + 2], "little") % 200 + 3).to_bytes(2, "little")
    path.write_bytes(bytes(data))
    open_prepared(a_copy)  # size, invariants and ids are fine
    with pytest.raises(CorpusError, match="sha256"):
        open_prepared(a_copy, verify_hash=True)
    problems = verify_prepared(a_copy)
    assert len(problems) == 1 and "train/tokens.bin: sha256 mismatch" in problems[0]


def test_verify_prepared_lists_missing_files_and_a_swapped_tokenizer(a_copy, made):
    (a_copy / "val" / "doc_lengths.npy").unlink()
    assert any("val/doc_lengths.npy: missing" in p for p in verify_prepared(a_copy))
    shutil.copy(made / "A" / "val" / "doc_lengths.npy", a_copy / "val" / "doc_lengths.npy")
    with open(a_copy / "tokenizer.json", "a", encoding="utf-8") as f:
        f.write(" ")
    assert any("tokenizer.json" in p for p in verify_prepared(a_copy))
    with pytest.raises(CorpusError, match="the tokenizer and the tokens did not come from the same run"):
        open_prepared(a_copy)


@pytest.mark.parametrize("change, message", [
    ({"version": 2}, "version 2, this minilmd reads version 1"),
    ({"format": "something-else"}, "format is 'something-else'"),
    ({"special_ids": {"pad": 2, "bos": 1, "eos": 0}}, "special_ids .* differ"),
])
def test_meta_format_version_and_special_ids_are_checked(a_copy, change, message):
    meta = json.loads((a_copy / "meta.json").read_text())
    (a_copy / "meta.json").write_text(json.dumps({**meta, **change}))
    with pytest.raises(CorpusError, match=message):
        open_prepared(a_copy)
    assert verify_prepared(a_copy)


def test_empty_val_split_opens(tokenizer, tmp_path):
    src = write_jsonl(tmp_path / "one.jsonl", ["只有一篇"])
    prepare([str(src)], tokenizer, tmp_path / "p", val_fraction=0.0, workers=0, progress=False,
            log=lambda m: None)
    pc = open_prepared(tmp_path / "p", verify_hash=True)
    assert pc.val.n_docs == 0 and pc.val.n_tokens == 0 and list(pc.val.doc_starts) == [0]
    assert pc.train.n_docs == 1
