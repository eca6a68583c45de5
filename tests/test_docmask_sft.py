"""Padding-free SFT (`data.mode = "packed"` + `data.doc_mask` on a chat corpus): whole conversations packed into
rows, each seeing only itself, learn exactly what one conversation per row learns.

For the same conversations in one global batch, the loss and gradients of the packed rows equal those of static
padding (CPU fp32, <= 1e-5 relative), through the trainer's own step, on far fewer rows and PAD tokens; the rows
never split a conversation, keep its assistant-only mask, and come in an order that is a pure function of
(seed, epoch).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from chat_synthetic import synthetic_chat_prepared
from minilmd.config import load_config
from minilmd.corpus.format import open_prepared
from minilmd.plan.docpacking import PackedConversationsSampler, pack_longest_fit
from minilmd.plan.samplers import make_sampler, validation_batches
from minilmd.trainer.loop.train import Dist, Trainer
from trainer_corpus import write_config
from weights_helpers import assert_same_weights_and_optimizer

N_CONVERSATIONS = 96
SEQ_LEN = 128
SEED = 1337  # write_config's default train.seed


@pytest.fixture(scope="module")
def chat(tmp_path_factory, corpus):
    prepared, vocab = corpus
    root = tmp_path_factory.mktemp("chat")
    return synthetic_chat_prepared(root / "prepared", prepared / "tokenizer.json", vocab, n=N_CONVERSATIONS,
                                   mean_len=40.0, max_len=SEQ_LEN), vocab


def packed_sampler(chat) -> PackedConversationsSampler:
    train = open_prepared(chat[0]).train
    sampler = make_sampler("packed", train.tokens, train.doc_starts, SEQ_LEN, SEED, train.loss_mask, doc_mask=True)
    assert isinstance(sampler, PackedConversationsSampler)
    return sampler


def trainer(tmp_path, chat, name: str, data: dict, micro: int, accum: int) -> Trainer:
    config = write_config(tmp_path, chat, name=name, data=data,
                          train={"seq_len": SEQ_LEN, "micro_batch_size": micro, "grad_accum": accum, "max_steps": 1})
    return Trainer(load_config(config), Dist(0, 1, 0, torch.device("cpu")))


def test_each_row_takes_the_longest_that_fits_ties_in_the_given_order():
    lengths = np.array([5, 4, 3, 6, 2, 4, 9])
    rows = pack_longest_fit(lengths, np.array([0, 1, 2, 3, 4, 5, 6]), 10)
    assert [r.tolist() for r in rows] == [[6], [3, 1], [0, 5], [2, 4]]
    rows = pack_longest_fit(lengths, np.array([5, 4, 3, 2, 1, 0, 6]), 10)
    assert [r.tolist() for r in rows] == [[6], [3, 5], [0, 1], [2, 4]]  # the other 4 first
    assert all(lengths[r].sum() <= 10 for r in rows)


def test_rows_hold_whole_conversations_with_their_masks(chat):
    sampler = packed_sampler(chat)
    train = open_prepared(chat[0]).train
    k = sampler.items_per_epoch
    assert k < N_CONVERSATIONS / 2  # several conversations a row
    assert sorted(np.concatenate(sampler.groups).tolist()) == list(range(N_CONVERSATIONS))  # each once
    batch = sampler.rows(np.arange(k))
    assert batch.positions is not None
    seen = 0
    for r in range(k):
        starts = np.flatnonzero(batch.positions[r] == 0)
        for d, lo in zip(sampler.groups[int(sampler.order.items(np.array([r]))[0][0])], starts, strict=False):
            n = int(train.doc_lengths[d])
            np.testing.assert_array_equal(batch.input_ids[r, lo:lo + n], train.document(int(d)))
            np.testing.assert_array_equal(batch.targets[r, lo:lo + n], train.document_mask(int(d)))
            seen += 1
    assert seen == N_CONVERSATIONS
    assert batch.n_targets == int(batch.targets[:, 1:].sum()) == train.target_tokens
    assert batch.n_real_tokens == train.n_tokens
    assert 0 <= sampler.pad_share() < 0.25


def test_row_order_is_a_pure_function_of_seed_and_epoch(chat):
    a, b = packed_sampler(chat), packed_sampler(chat)
    k = a.items_per_epoch
    first, again = a.rows(np.arange(k)), b.rows(np.arange(k))
    np.testing.assert_array_equal(first.input_ids, again.input_ids)
    second = a.rows(np.arange(k, 2 * k))  # epoch 1: the same rows, another order
    assert not np.array_equal(first.input_ids, second.input_ids)
    assert sorted(map(bytes, first.input_ids)) == sorted(map(bytes, second.input_ids))


@pytest.mark.slow
def test_padding_free_and_static_padding_give_the_same_loss_and_gradients(tmp_path, chat):
    k = packed_sampler(chat).items_per_epoch
    packed = trainer(tmp_path, chat, "packed", {"mode": "packed", "doc_mask": True}, micro=k, accum=1)
    static = trainer(tmp_path, chat, "padded", {"mode": "padded"}, micro=8, accum=N_CONVERSATIONS // 8)
    assert packed.sampler.global_counts(0, k)[0] == static.sampler.global_counts(0, N_CONVERSATIONS)[0]
    results = []
    for t in (packed, static):
        loss, _ = t.accumulate_gradients(0)
        results.append((float(loss), {n: p.grad.clone() for n, p in t.model.named_parameters()}))
    (loss_p, grads_p), (loss_s, grads_s) = results
    assert loss_p == pytest.approx(loss_s, rel=1e-5, abs=0)
    worst = max(float((grads_p[n] - grads_s[n]).norm() / grads_s[n].norm()) for n in grads_s)
    assert worst <= 1e-5, f"gradients differ by {worst:.2e} relative"
    # The validation rows are the padded mode's, one conversation each: the val loss compares with other runs.
    val = open_prepared(chat[0]).val
    want = validation_batches("padded", val.tokens, val.doc_starts, SEQ_LEN, 8, k, val.loss_mask)
    assert [b.input_ids.tobytes() for b in packed.val_batches] == [b.input_ids.tobytes() for b in want]
    assert packed.evaluate() == pytest.approx(static.evaluate(), rel=1e-5)


@pytest.mark.slow
def test_sigkilled_padding_free_sft_run_resumes_bit_identical(tmp_path, chat_corpus_short, undisturbed):
    import json
    import signal

    from minilmd.names import FAULT_ENV, METRICS
    from minilmd.protocol import EXIT_DONE
    from resume_helpers import attempt, attempt_here
    from supervisor_helpers import BASELINE
    from supervisor_helpers import write_config as supervised_config

    padding_free = {"data": {"mode": "packed", "doc_mask": True}, **BASELINE}
    final = undisturbed("packed", doc_mask=True, chat=True).checkpoint  # shared with test_docmask_run.py
    killed = supervised_config(tmp_path, chat_corpus_short, "killed", remote=False, **padding_free)
    code, out = attempt(killed, **{FAULT_ENV: "sigkill@10"})
    assert code == -signal.SIGKILL, out
    code, out = attempt_here(killed)  # nothing kills this one: in the test's process
    assert code == EXIT_DONE and "resumed from" in out and "packed rows" in out, out
    mine = load_config(killed).checkpoint_dir / final.name
    assert_same_weights_and_optimizer(final, mine)
    lines = [json.loads(line) for line in (load_config(killed).run_dir / METRICS).read_text().splitlines()]
    assert {r["step"] for r in lines if r.get("kind") == "train"} == set(range(1, 17))


@pytest.mark.slow
def test_doc_mask_keeps_a_chat_run_packed_against_the_sft_default(tmp_path, chat):
    config = write_config(tmp_path, chat, name="defaults", data={"doc_mask": True},
                          train={"seq_len": SEQ_LEN, "micro_batch_size": 4, "grad_accum": 1, "max_steps": 1})
    t = Trainer(load_config(config), Dist(0, 1, 0, torch.device("cpu")))
    assert t.cfg.data.mode == "packed" and isinstance(t.sampler, PackedConversationsSampler)
    assert "data.mode" not in t.stage_defaults
