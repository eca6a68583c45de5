"""An SFT run whose train.seq_len is shorter than the corpus was prepared at (minilmd/replycut.py, rowcount.py
replies_fit): a row keeps a conversation's first seq_len tokens, so the replies past them train nothing, and a
conversation whose replies all lie past them (a long system prompt: MiniMind's tool-call lines) trains nothing at
all. `run --check` and the trainer count it (exact; `run --check` samples the long conversations past a bound), warn
of any, and refuse (exit 2) past half of the reply tokens lost, naming the prepared --seq-len. The counts match a
count by hand over the corpus's masks. Before: `run --check` said OK and the trainer nothing (user7 #1)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from chat_helpers import prepared_chat, read_conversations, write_jsonl
from in_process import train_in_process
from minilmd.cli import app
from minilmd.config import ConfigError, load_config
from minilmd.corpus.format import open_prepared
from minilmd.plan.bucketing import check_replies_fit
from minilmd.plan.samplers import make_sampler
from minilmd.protocol import EXIT_CONFIG
from minilmd.replycut import chat_replies_cut
from minilmd.rowcount import RepliesCut, replies_fit
from trainer_corpus import write_config

PREPARED_AT = 96
SYSTEM = "工具清单：" + "，".join(str(i) for i in range(1000, 1010))  # a long system prompt: its replies lie late


@pytest.fixture(scope="module")
def corpus(chat_jsonl, chat_tokenizer, tmp_path_factory) -> tuple:
    """(root, vocabulary) of 120 real conversations, a third of them behind a long system prompt, prepared at
    --seq-len 96."""
    out = tmp_path_factory.mktemp("sft96")
    conversations = read_conversations(chat_jsonl)[:120]
    lines = [{"conversations": ([{"role": "system", "content": SYSTEM}] if i % 3 == 0 else []) + c}
             for i, c in enumerate(conversations)]
    root = prepared_chat([write_jsonl(out / "c.jsonl", lines)], chat_tokenizer, out / "corpus", seq_len=PREPARED_AT,
                         val_fraction=0.1)
    return root, json.loads((root / "meta.json").read_text(encoding="utf-8"))["vocab_size"]


def _by_hand(root, seq_len: int) -> dict[str, tuple[int, int, int, int]]:
    """Per split: (conversations keeping no target in their first seq_len tokens, conversations, targets past them,
    targets)."""
    pc, out = open_prepared(root), {}
    for split, stream in (("train", pc.train), ("val", pc.val)):
        masks = [np.asarray(stream.document_mask(d)) for d in range(stream.n_docs)]
        out[split] = (sum(not m[1:seq_len].any() for m in masks), len(masks),
                      sum(int(m[seq_len:].sum()) for m in masks), sum(int(m.sum()) for m in masks))
    return out


def _config(tmp_path, corpus, name, seq_len):
    return write_config(tmp_path, corpus, name=name, train={"seq_len": seq_len, "micro_batch_size": 4,
                                                           "grad_accum": 1, "max_steps": 2})


def _refused_and_warned(root) -> tuple[int, int]:
    """A seq_len that loses more than half the reply tokens, and one that leaves some conversation without any but
    loses less than half."""
    counts = {t: _by_hand(root, t) for t in range(8, PREPARED_AT, 4)}

    def share(t):
        return sum(c[2] for c in counts[t].values()) / sum(c[3] for c in counts[t].values())
    refused = max(t for t in counts if share(t) > 0.5)
    warned = min(t for t in counts if share(t) < 0.5 and counts[t]["train"][0])
    return refused, warned


def test_the_count_matches_a_hand_count_and_the_trainer_refuses_or_warns(tmp_path, corpus, capsys):
    root = corpus[0]
    pc = open_prepared(root)
    refused, warned = _refused_and_warned(root)
    for seq_len in (refused, warned, PREPARED_AT):
        hand = _by_hand(root, seq_len)
        for split in ("train", "val"):
            cut = chat_replies_cut(root / split, seq_len, hand[split][3])  # run --check's: only the long ones read
            assert (cut.without_reply, cut.items, cut.targets_lost, cut.targets) == hand[split]
            assert not cut.sampled
    assert _by_hand(root, warned)["train"][0] > 0  # the observation: conversations that train nothing
    sampled = chat_replies_cut(root / "train", warned, _by_hand(root, warned)["train"][3], limit=3)
    assert sampled.sampled and sampled.targets_lost > 0  # a bound on what is read: an estimate, said to be one

    def trainer_check(seq_len):  # what the trainer runs at its start, over its own rows
        cfg = load_config(_config(tmp_path, corpus, f"t{seq_len}", seq_len))
        sampler = make_sampler("bucketed", pc.train.tokens, pc.train.doc_starts, seq_len, 0, pc.train.loss_mask, 4)
        check_replies_fit(sampler, pc.val, pc.meta, cfg, warn=True)

    with pytest.raises(ConfigError) as e:
        trainer_check(refused)
    said = " ".join(str(e.value).split())
    assert f"train.seq_len = {refused} cuts" in said and f"raise train.seq_len to {PREPARED_AT}" in said, said
    train = _by_hand(root, refused)["train"]
    assert f"train: {train[0]:,} of {train[1]:,} conversations keep no reply token, {train[2]:,} of {train[3]:,}" \
        in said, said
    trainer_check(warned)
    out = " ".join(capsys.readouterr().out.split())
    assert f"minilmd train: warning: train.seq_len = {warned} cuts" in out, out
    trainer_check(PREPARED_AT)
    assert capsys.readouterr().out == ""


def test_the_rule_refuses_past_half_of_the_reply_tokens_and_warns_of_any():
    def fit(lost, total, without=0):
        return replies_fit({"train": RepliesCut(without, 100, lost, total)}, 64, 256)
    assert fit(0, 1000) == ("", "")
    assert fit(1, 1000)[1] and not fit(1, 1000)[0]
    assert fit(0, 1000, without=1)[1]  # a conversation left without a reply, however few tokens
    assert fit(500, 1000)[1] and not fit(500, 1000)[0]
    assert fit(501, 1000)[0] and "raise train.seq_len to 256, the --seq-len the corpus was prepared at" in \
        fit(501, 1000)[0]


@pytest.mark.slow  # two config checks with their storage probes, and a trainer process
def test_run_check_and_the_trainer_say_it(tmp_path, corpus):
    refused, warned = _refused_and_warned(corpus[0])
    runner = CliRunner()
    r = runner.invoke(app, ["run", "--check", str(_config(tmp_path, corpus, "short", refused))])
    assert r.exit_code == 2 and f"train.seq_len = {refused} cuts" in " ".join(r.output.split()), r.output
    w = runner.invoke(app, ["run", "--check", str(_config(tmp_path, corpus, "some", warned))])
    assert w.exit_code == 0 and f"note: train.seq_len = {warned} cuts" in " ".join(w.output.split()), w.output
    p = train_in_process(_config(tmp_path, corpus, "short", refused))
    assert p.returncode == EXIT_CONFIG and f"train.seq_len = {refused} cuts" in " ".join(p.stderr.split()), p.stderr
