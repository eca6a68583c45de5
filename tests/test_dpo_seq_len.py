"""A DPO run whose train.seq_len cuts the final replies of its pairs away (minilmd/rowcount.py pairs_fit): such a
pair has no target in its rows, so a margin of 0 and a constant ln 2 loss with no gradient. `run --check` and the
trainer refuse (exit 2) a seq_len that leaves a reply token to fewer than half of the pairs, or to none of a split's,
and warn of one that leaves some without; the counts are exact, from meta.json's `dpo.<split>.reply_starts` (run
--check) or the trainer's own rows, and match a count by hand over the corpus's masks."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from chat_helpers import preference_pairs, prepared_chat, read_conversations, write_jsonl
from in_process import train_in_process
from minilmd.cli import app
from minilmd.config import ConfigError, load_config
from minilmd.corpus.format import open_prepared
from minilmd.plan.pairs import PairRows, check_pairs_fit
from minilmd.protocol import EXIT_CONFIG
from minilmd.rowcount import pairs_fit, pairs_past_cut
from trainer_corpus import run_paths, write_config

PREPARED_AT = 64


@pytest.fixture(scope="module")
def corpus(chat_jsonl, chat_tokenizer, tmp_path_factory) -> tuple:
    """(root, vocabulary) of 200 real pairs prepared at --seq-len 64, val fraction 0.2."""
    out = tmp_path_factory.mktemp("dpo64")
    pairs = preference_pairs(read_conversations(chat_jsonl))[:200]
    root = prepared_chat([write_jsonl(out / "p.jsonl", pairs)], chat_tokenizer, out / "corpus", seq_len=PREPARED_AT,
                         val_fraction=0.2, data_format="dpo")
    return root, json.loads((root / "meta.json").read_text(encoding="utf-8"))["vocab_size"]


def _later_starts(root) -> dict[str, np.ndarray]:
    """By hand: per split, each pair's offset of its later side's first reply token."""
    pc = open_prepared(root)
    starts = {}
    for split, stream in (("train", pc.train), ("val", pc.val)):
        first = [int(np.argmax(np.asarray(stream.document_mask(d)))) for d in range(stream.n_docs)]
        starts[split] = np.maximum(first[0::2], first[1::2])
    return starts


def _lost(starts, seq_len) -> dict[str, tuple[int, int]]:
    return {split: (int((s >= seq_len).sum()), s.size) for split, s in starts.items()}


def _some_lost(starts) -> int:
    """A seq_len that leaves some pairs of a split without a reply token, but not half of them, nor a whole split."""
    for seq_len in sorted({int(s) for s in np.concatenate(list(starts.values()))}, reverse=True):
        lost = _lost(starts, seq_len)
        if any(n_lost for n_lost, _ in lost.values()) and 2 * sum(n_lost for n_lost, _ in lost.values()) < sum(
                n for _, n in lost.values()) and all(n_lost < n for n_lost, n in lost.values()):
            return seq_len
    raise AssertionError("no such seq_len in this corpus")


def _config(tmp_path, corpus, name, seq_len):
    return write_config(tmp_path, corpus, name=name, data={"val_windows": 16},
                        train={"seq_len": seq_len, "micro_batch_size": 4, "grad_accum": 1, "max_steps": 2})


def _said(lost: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{n_lost:,} of {n:,} {split} pairs" for split, (n_lost, n) in lost.items() if n_lost)


@pytest.mark.slow  # three config checks with their storage probes, and a trainer process
def test_check_and_the_trainer_refuse_a_seq_len_that_cuts_most_replies_away_and_warn_of_some(tmp_path, corpus):
    starts = _later_starts(corpus[0])
    lost = _lost(starts, 16)
    assert 2 * sum(n_lost for n_lost, _ in lost.values()) > sum(n for _, n in lost.values())  # the observation
    longest = max(int(s.max()) for s in starts.values())
    runner = CliRunner()
    refused = runner.invoke(app, ["run", "--check", str(_config(tmp_path, corpus, "short", 16))])
    said = " ".join(refused.output.split())
    assert refused.exit_code == 2, refused.output
    assert f"train.seq_len = 16 cuts away the whole final reply of {_said(lost)}" in said, said
    assert f"set train.seq_len >= {longest + 1}" in said and "prepare the corpus again at --seq-len 16" in said
    p = train_in_process(_config(tmp_path, corpus, "short", 16))
    assert p.returncode == EXIT_CONFIG and f"final reply of {_said(lost)}" in " ".join(p.stderr.split()), p.stderr
    assert not run_paths(_config(tmp_path, corpus, "short", 16))[1].exists()  # nothing trained
    some = _some_lost(starts)
    warned = runner.invoke(app, ["run", "--check", str(_config(tmp_path, corpus, "some", some))])
    assert warned.exit_code == 0, warned.output
    assert f"note: train.seq_len = {some} cuts away the whole final reply of {_said(_lost(starts, some))}" in \
        " ".join(warned.output.split()), warned.output
    fits = runner.invoke(app, ["run", "--check", str(_config(tmp_path, corpus, "fits", longest + 1))])
    assert fits.exit_code == 0 and "final reply" not in fits.output, fits.output


def test_the_trainer_counts_the_pairs_in_its_rows_for_a_corpus_prepared_before_reply_starts(tmp_path, corpus, capsys):
    root = shutil.copytree(corpus[0], tmp_path / "old")
    meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
    starts = _later_starts(root)
    assert [[int(s), int(c)] for s, c in zip(*np.unique(starts["train"], return_counts=True), strict=True)] == \
        meta["dpo"]["train"]["reply_starts"]  # what run --check counts from: the hand count's
    for split in ("train", "val"):
        del meta["dpo"][split]["reply_starts"]
    (root / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    pc = open_prepared(root)

    def rows(seq_len):
        return [PairRows(s.tokens, s.doc_starts, seq_len, s.loss_mask) for s in (pc.train, pc.val)]

    cfg = load_config(_config(tmp_path, (root, corpus[1]), "old", 16))
    with pytest.raises(ConfigError) as e:
        check_pairs_fit(*rows(16), pc.meta, cfg, warn=True)
    assert f"cuts away the whole final reply of {_said(_lost(starts, 16))}" in str(e.value)
    some = _some_lost(starts)
    check_pairs_fit(*rows(some), pc.meta, cfg, warn=True)
    assert f"minilmd train: warning: train.seq_len = {some} cuts away the whole final reply of " \
           f"{_said(_lost(starts, some))}" in capsys.readouterr().out
    bound, exact = pairs_past_cut(meta, 16)  # meta.json alone: a lower bound, from the prompt's figures
    assert not exact and all(0 < bound[s][0] <= n_lost for s, (n_lost, _) in _lost(starts, 16).items())
    assert pairs_fit(meta, 16)[0].startswith("train.seq_len = 16 cuts away the whole final reply of at least ")
    # the rule: refused when fewer than half of all pairs keep a reply token (the review's 332 of 357 lost), or
    # when a split keeps none; a warning otherwise
    assert pairs_fit(meta, 16, {"train": (332, 357), "val": (10, 40)})[0]
    assert pairs_fit(meta, 16, {"train": (0, 357), "val": (40, 40)})[0]
    assert pairs_fit(meta, 16, {"train": (100, 357), "val": (10, 40)}) == ("", pairs_fit(meta, 16, {
        "train": (100, 357), "val": (10, 40)})[1]) != ("", "")
