"""prepare never writes a corpus the trainer cannot use for want of a split: an empty val split (too few documents
for --val-fraction, or every val document a duplicate of a train one) or an empty train split is refused with
exit 65 and a message that says what to change; the --val-fraction it suggests does put a document into val."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from data_helpers import write_jsonl
from minilmd.corpus.format import open_prepared
from minilmd.corpus.prepare.pipeline import split_is_val

TEXTS = [f"第{i}篇：小语料的一篇文档。" for i in range(20)]


def prepare_cli(src, tokenizer, out, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", "prepare", str(src), "--tokenizer", str(tokenizer),
                           "--out", str(out), "--workers", "0", *extra], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_an_empty_val_split_is_refused_and_the_suggested_fraction_works(tmp_path, tokenizer):
    assert not any(split_is_val(t, 0.005) for t in TEXTS)  # the observation: 20 documents, none in val
    src = write_jsonl(tmp_path / "small.jsonl", TEXTS)
    refused = prepare_cli(src, tokenizer, tmp_path / "p")
    assert refused.returncode == 65, refused.stderr
    assert "the val split is empty: none of the 20 documents fell into val at --val-fraction 0.005" in refused.stderr
    assert not (tmp_path / "p").exists() and not list(tmp_path.glob(".p.*"))
    suggested = re.search(r"--val-fraction (\S+) puts at least one document there", refused.stderr).group(1)
    assert any(split_is_val(t, float(suggested)) for t in TEXTS)
    done = prepare_cli(src, tokenizer, tmp_path / "p", "--val-fraction", suggested)
    assert done.returncode == 0, done.stderr
    assert open_prepared(tmp_path / "p").val.n_docs >= 1


def test_a_val_split_emptied_by_the_leak_check_is_refused(tmp_path, tokenizer):
    val_text = next(t for t in (f"只出现在验证集的文档 {i}" for i in range(10000)) if split_is_val(t, 0.05))
    variant = val_text.replace(" ", "  ")  # the same text but for whitespace, so a leak
    train = [t for t in TEXTS if not split_is_val(t, 0.05)]
    assert not split_is_val(variant, 0.05)
    src = write_jsonl(tmp_path / "leaky.jsonl", [*train, val_text, variant])
    refused = prepare_cli(src, tokenizer, tmp_path / "p", "--val-fraction", "0.05")
    assert refused.returncode == 65
    assert "the val split is empty: all 1 val document(s) repeat train documents" in refused.stderr


def test_an_empty_train_split_is_refused(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "one.jsonl", [next(t for t in TEXTS if split_is_val(t, 0.5))])
    refused = prepare_cli(src, tokenizer, tmp_path / "p", "--val-fraction", "0.5")
    assert refused.returncode == 65 and "the train split is empty: all 1 documents fell into val" in refused.stderr


def test_val_fraction_zero_is_a_corpus_without_val_by_request(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "small.jsonl", TEXTS)
    done = prepare_cli(src, tokenizer, tmp_path / "p", "--val-fraction", "0")
    assert done.returncode == 0, done.stderr
    assert "--val-fraction 0: no val split" in done.stderr
    assert open_prepared(tmp_path / "p").val.n_docs == 0


def test_documents_that_are_all_one_text_are_said_to_be_so_not_given_a_fraction_that_empties_train(tmp_path,
                                                                                                   tokenizer):
    text = next(t for t in TEXTS if not split_is_val(t, 0.05))
    src = write_jsonl(tmp_path / "same.jsonl", [text] * 40)  # a newcomer's one line repeated (user7 #6)
    for fraction in ("0.05", "0.99"):  # all in train, then all in val: no fraction splits one text
        refused = prepare_cli(src, tokenizer, tmp_path / "p", "--val-fraction", fraction)
        said = " ".join(refused.stderr.split())
        assert refused.returncode == 65, refused.stderr
        assert "all 40 documents are the same text once whitespace is removed" in said, said
        assert "exact copies fall into one split" in said and "at least two distinct" in said, said
        assert "puts at least one" not in said and "here all" not in said, said  # none in val to remove


def test_documents_of_one_text_but_for_whitespace_split_and_lose_their_val_ones_to_the_leak_check(tmp_path,
                                                                                                tokenizer):
    """Review 9b #11: copies of one text counted by the whitespace-free leak key were said to "always fall into
    one split (the split is by a hash of each text)": variants in whitespace hash apart, so some fall into val,
    and there the leak check removes them as repeats of the train ones."""
    base = TEXTS[1]
    variants = [base[:i] + " " + base[i:] for i in range(1, len(base))]  # one text, a space put in somewhere
    in_val = [split_is_val(v, 0.5) for v in variants]
    assert any(in_val) and not all(in_val)  # the split hashes the exact text: the variants fall into both
    src = write_jsonl(tmp_path / "spaced.jsonl", variants)
    refused = prepare_cli(src, tokenizer, tmp_path / "p", "--val-fraction", "0.5")
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 65, refused.stderr
    assert f"the val split is empty: all {len(variants)} documents are the same text once whitespace is removed, " \
           "so no --val-fraction splits them" in said, said
    assert "removed by the leak check" in said and f"(here all {sum(in_val)} that fell into val were)" in said, said
    assert "always fall into one split" not in said, said
