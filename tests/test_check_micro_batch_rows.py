"""`run --check` refuses a train split too small for one micro-batch, as the trainer does, by one rule
(minilmd/rowcount.py too_few_rows): the samplers (plan/bucketing.py, plan/pairs.py) and the config check
(minilmd/probes.py, `run --check` and the launch's preflight) call it. A new user's walk (user5 #1): a DPO config
with train.micro_batch_size = 64 on 31 train pairs passed `--check` with "OK" and "this run trains 0 sample
updates", then the launch died in the trainer (exit 65). Each stage's rows: a pretraining corpus's documents in
bucketed mode, an SFT corpus's conversations (its stage's default mode is bucketed), a DPO corpus's pairs."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.corpus.format import open_prepared
from minilmd.plan.bucketing import BucketedSampler
from minilmd.plan.pairs import PairSampler
from minilmd.plan.sampler_base import DataError
from minilmd.protocol import SUPERVISOR_CONFIG
from minilmd.rowcount import too_few_rows
from supervisor_helpers import cli
from trainer_corpus import write_config


def _train_documents(corpus_dir) -> int:
    return json.loads((corpus_dir / "meta.json").read_text(encoding="utf-8"))["splits"]["train"]["documents"]


def _check(config, *sets: str):
    result = CliRunner().invoke(app, ["run", "--check", str(config), *[a for s in sets for a in ("--set", s)]])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("stage", ["pretrain", "sft", "dpo"])
def test_a_micro_batch_larger_than_the_train_split_is_refused_at_check_as_the_trainer_refuses_it(
        tmp_path, stage, request):
    corpus = request.getfixturevalue({"pretrain": "corpus", "sft": "chat_corpus", "dpo": "dpo_corpus"}[stage])
    documents = _train_documents(corpus[0])
    items, unit = (documents // 2, "pairs") if stage == "dpo" else (documents, "conversations" if stage == "sft"
                                                                     else "documents")
    data = {"mode": "bucketed"} if stage == "pretrain" else {}  # SFT's stage default: bucketed
    config = write_config(tmp_path, corpus, name=stage, data=data,
                          train={"seq_len": 128, "micro_batch_size": items + 1, "grad_accum": 1})
    code, said = _check(config)
    assert code == SUPERVISOR_CONFIG, said
    why = (f"the train split has {items:,} {unit}, fewer than one micro-batch of train.micro_batch_size = "
           f"{items + 1:,}")
    assert why in said and f"set train.micro_batch_size <= {items:,}" in said, said
    assert "sample updates" not in said  # never "trains 0 sample updates"

    # the trainer's refusal is the same rule, in the same words
    train = open_prepared(corpus[0]).train
    with pytest.raises(DataError) as refused:
        if stage == "dpo":
            PairSampler(train.tokens, train.doc_starts, 128, 0, items + 1, train.loss_mask)
        else:
            BucketedSampler(train.tokens, train.doc_starts, 128, 0, items + 1, train.loss_mask)
    assert str(refused.value) == too_few_rows("pairs" if stage == "dpo" else "bucketed", items=items, tokens=0,
                                              seq_len=128, micro_batch_size=items + 1, unit=unit)
    assert str(refused.value) in said

    code, said = _check(config, f"train.micro_batch_size={items}")  # the limit the message names: accepted
    assert code == 0 and "fewer than one micro-batch" not in said, said


def test_the_launch_refuses_it_before_the_trainer_in_the_same_words(tmp_path, dpo_corpus):
    pairs = _train_documents(dpo_corpus[0]) // 2
    config = write_config(tmp_path, dpo_corpus, name="dpo", train={"seq_len": 128, "micro_batch_size": pairs + 1})
    for args in (("run", "--check", str(config)), ("run", str(config))):
        out = cli(*args, timeout=120)
        text = " ".join((out.stdout + out.stderr).split())
        assert out.returncode == SUPERVISOR_CONFIG, text
        assert f"the train split has {pairs:,} pairs, fewer than one micro-batch" in text, text


def test_a_padded_or_packed_run_needs_one_row_not_one_micro_batch(tmp_path, corpus):
    """A micro-batch larger than a padded epoch repeats its rows: no refusal (the samplers continue across
    epochs)."""
    documents = _train_documents(corpus[0])
    config = write_config(tmp_path, corpus, name="padded", data={"mode": "padded"},
                          train={"seq_len": 128, "micro_batch_size": documents + 1, "grad_accum": 1})
    code, said = _check(config)
    assert code == 0, said
    assert too_few_rows("padded", items=0, tokens=0, seq_len=8, micro_batch_size=1, unit="documents") == \
        "the train split has no documents"
