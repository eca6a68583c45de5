"""Document-masked packing (`data.doc_mask = true`): a packed row computes what its documents compute alone.

The proof, on a tiny model in CPU fp32: the per-token losses of a masked packed row equal those of each of its
document pieces run alone (rotary positions from 0, plain causal attention), and the gradients of the row's summed
loss equal the sum of theirs; through the trainer, the masked windows' loss is the sum over their pieces. Without
doc_mask nothing changes: the same batches (no positions), the same call into the model. Around it: the pieces'
positions from doc_lengths (not from the ids), the config rule (packed only), the checkpoint's record of the
setting (a resume with the other one is refused), a SIGKILLed masked run resuming bit for bit, 2 gloo ranks
matching 1, and the flex_attention block mask (CUDA, compiled) computing what the dense mask does.
"""
from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from in_process import train_in_process
from minilmd import checkpoint as ck
from minilmd.config import ConfigError, load_config
from minilmd.names import FAULT_ENV, METRICS
from minilmd.plan.docmask import window_positions
from minilmd.plan.samplers import make_sampler, validation_batches
from minilmd.protocol import EXIT_CONFIG, EXIT_DONE
from minilmd.trainer.loop.train import Dist, Trainer
from minilmd.trainer.model.docattention import document_mask
from minilmd.trainer.model.minimind import MiniMindForCausalLM
from resume_helpers import attempt, attempt_here
from supervisor_helpers import BASELINE
from supervisor_helpers import write_config as supervised_config
from trainer_corpus import TINY_MODEL, write_config
from weights_helpers import assert_same_weights_and_optimizer

VOCAB = 97


def tiny_model() -> MiniMindForCausalLM:
    torch.manual_seed(0)
    return MiniMindForCausalLM({**TINY_MODEL, "vocab_size": VOCAB})


def per_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(time - 1,) loss of predicting ids[1:] from logits[:-1] (one row)."""
    return F.cross_entropy(logits[:-1].float(), ids[1:], reduction="none")


def test_positions_restart_at_every_document_start_from_doc_lengths_not_ids():
    doc_starts = np.array([0, 5, 7, 20, 26])  # documents of 5, 2, 13 and 6 tokens
    pos = window_positions(np.array([0, 3, 18]), 8, doc_starts)
    assert pos.dtype == np.int32
    assert pos[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 0]     # doc 0, doc 1, doc 2's start
    assert pos[1].tolist() == [0, 1, 0, 1, 0, 1, 2, 3]     # the tail of doc 0 is a piece of its own
    assert pos[2].tolist() == [0, 1, 0, 1, 2, 3, 4, 5]
    mask = document_mask(torch.from_numpy(pos))[1, 0]
    assert mask.shape == (8, 8)
    assert mask[3].tolist() == [False, False, True, True, False, False, False, False]  # its own piece, causally


def test_masked_packed_row_equals_each_document_alone_losses_and_gradients():
    g = torch.Generator().manual_seed(1)
    lengths = [9, 23, 4, 15, 13]  # one row of 64: four whole documents and the head of a fifth
    docs = [torch.randint(3, VOCAB, (n,), generator=g) for n in lengths]
    row = torch.cat(docs)[:64]
    positions = torch.from_numpy(window_positions(np.array([0]), 64, np.cumsum([0, *lengths])))
    pieces = [d for d in docs[:4]] + [docs[4][:64 - sum(lengths[:4])]]

    model = tiny_model()
    logits = model(row[None], positions=positions).logits[0]
    losses = per_token_loss(logits, row)
    starts = np.cumsum([0, *[len(p) for p in pieces]])
    keep = positions[0, 1:] != 0  # a piece's first token is predicted by no one
    alone_losses = []
    for piece, lo in zip(pieces, starts[:-1], strict=True):
        alone = per_token_loss(model(piece[None]).logits[0], piece).detach()
        alone_losses.append(alone)
        torch.testing.assert_close(losses[lo:lo + len(piece) - 1], alone, rtol=1e-5, atol=1e-5)
    assert int(keep.sum()) == sum(len(p) - 1 for p in pieces)
    assert not bool(keep[starts[1:-1] - 1].any())  # the EOS -> next BOS predictions are out

    losses[keep].sum().backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    sum(a.sum() for a in [per_token_loss(model(p[None]).logits[0], p) for p in pieces]).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(packed[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)
    assert float(sum(a.sum() for a in alone_losses)) == pytest.approx(float(losses[keep].sum().detach()), rel=1e-5)

    unmasked = per_token_loss(model(row[None]).logits[0], row)  # without the mask the later documents see more
    assert not torch.allclose(unmasked[starts[1]:], losses[starts[1]:], atol=1e-4)


def test_a_row_of_one_document_is_the_plain_causal_row():
    row = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    model = tiny_model()
    plain = model(row).logits
    masked = model(row, positions=torch.arange(40, dtype=torch.int32)[None]).logits
    torch.testing.assert_close(masked, plain, rtol=1e-5, atol=1e-5)


def trainer(tmp_path: Path, corpus, name: str, **data) -> Trainer:
    config = write_config(tmp_path, corpus, name=name, data={"mode": "packed", **data},
                          train={"seq_len": 64, "micro_batch_size": 4, "grad_accum": 2, "max_steps": 1})
    return Trainer(load_config(config), Dist(0, 1, 0, torch.device("cpu")))


def test_off_is_today_and_on_changes_only_positions_and_targets(tmp_path, corpus):
    off, on = trainer(tmp_path, corpus, "off"), trainer(tmp_path, corpus, "on", doc_mask=True)
    b_off, b_on = off.sampler.batch(3, 8), on.sampler.batch(3, 8)
    assert b_off.positions is None and b_off.targets is None  # exactly the batch of a run before doc_mask
    assert all(b.positions is None and b.targets is None for b in off.val_batches)
    np.testing.assert_array_equal(b_off.input_ids, b_on.input_ids)  # the same windows
    assert b_on.positions is not None and b_on.targets is not None
    np.testing.assert_array_equal(b_on.targets, (b_on.positions != 0).astype(np.uint8))
    assert b_on.n_targets == int((b_on.positions[:, 1:] != 0).sum()) < b_off.n_targets
    assert all(b.positions is not None for b in on.val_batches)
    assert on.sampler.global_counts(24, 8)[0] == on.sampler.batch(3, 8).n_targets

    calls = []
    forward = off.step_setup.forward

    def spy(batch):
        calls.append(batch.positions)
        return forward(batch)

    off.step_setup = dataclasses.replace(off.step_setup, forward=spy)
    off.accumulate_gradients(0)
    assert calls == [None] * 2  # the plain causal forward, as before doc_mask existed


def test_trainer_masked_loss_is_the_sum_over_document_pieces(tmp_path, corpus):
    t = trainer(tmp_path, corpus, "sum", doc_mask=True)
    loss, _ = t.accumulate_gradients(0)
    total, count = 0.0, 0
    with torch.no_grad():
        for micro in range(2):
            batch = t.sampler.batch(0, 8, micro=micro, micro_batch_size=4)
            for ids, pos in zip(batch.input_ids.astype(np.int64), batch.positions, strict=True):
                bounds = [*np.flatnonzero(pos == 0), len(pos)]
                for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                    if hi - lo > 1:
                        piece = torch.from_numpy(ids[lo:hi])
                        total += float(per_token_loss(t.model(piece[None]).logits[0], piece).sum())
                        count += hi - lo - 1
    assert count == t.sampler.global_counts(0, 8)[0]
    assert float(loss) == pytest.approx(total / count, rel=1e-5)


def test_positions_come_with_validation_and_never_with_one_document_modes(corpus):
    from minilmd.corpus.format import open_prepared

    c = open_prepared(corpus[0])
    val = validation_batches("packed", c.val.tokens, c.val.doc_starts, 64, 8, 4, None, doc_mask=True)
    assert all(b.positions is not None and b.positions.shape == b.input_ids.shape for b in val)
    padded = make_sampler("padded", c.train.tokens, c.train.doc_starts, 64, 1, doc_mask=True)
    assert padded.batch(0, 4).positions is None  # one document per row: nothing to mask


def test_doc_mask_needs_packed_mode(tmp_path, corpus):
    for mode in ("padded", "bucketed"):
        config = write_config(tmp_path, corpus, name=mode, data={"mode": mode, "doc_mask": True})
        with pytest.raises(ConfigError, match='data.doc_mask = true needs data.mode = "packed"'):
            load_config(config)


def test_checkpoint_records_the_setting_and_refuses_the_other(tmp_path, corpus):
    from minilmd.checkpoint import CheckpointMismatch, Expectation, validate

    t = trainer(tmp_path, corpus, "rec", doc_mask=True)
    t.train_step()
    t.step = 1
    t.save()
    t.saves.wait()
    path = t.cfg.checkpoint_dir / "step-00000001"
    state = json.loads((path / ck.TRAINER_STATE).read_text())
    assert state["config"]["data"]["doc_mask"] is True
    validate(path, t.expectation())
    plain = trainer(tmp_path, corpus, "rec-off")
    with pytest.raises(CheckpointMismatch, match="saved with data.doc_mask = true, the run has false") as e:
        validate(path, plain.expectation())
    assert e.value.kind == "model"
    del state["config"]["data"]["doc_mask"]  # a checkpoint from before doc_mask existed: trained without it
    expected = Expectation(model=plain.cfg.model_dict(), doc_mask=False)
    ck.check_expectation(path, state, expected)
    with pytest.raises(CheckpointMismatch):
        ck.check_expectation(path, state, Expectation(model=plain.cfg.model_dict(), doc_mask=True))


@pytest.mark.slow
def test_sigkilled_masked_run_resumes_bit_identical_and_refuses_the_other_setting(tmp_path, corpus, undisturbed):
    masked = {"data": {"mode": "packed", "doc_mask": True}, **BASELINE}
    final = undisturbed("packed", doc_mask=True).checkpoint  # shared with test_docmask_run.py
    killed = supervised_config(tmp_path, corpus, "killed", remote=False, **masked)
    code, out = attempt(killed, **{FAULT_ENV: "sigkill@10"})
    assert code == -signal.SIGKILL, out
    code, out = attempt_here(killed, "data.doc_mask=false")
    assert code == EXIT_CONFIG and "saved with data.doc_mask = true, the run has false" in out, out
    code, out = attempt_here(killed)
    assert code == EXIT_DONE and "resumed from" in out, out
    mine = load_config(killed).checkpoint_dir / final.name
    assert_same_weights_and_optimizer(final, mine)
    losses = [json.loads(line) for line in (load_config(killed).run_dir / METRICS).read_text().splitlines()]
    assert {r["step"] for r in losses if r.get("kind") == "train"} == set(range(1, 17))


def test_rows_of_two_corpus_versions_keep_their_pieces(corpus):
    from minilmd.corpus.format import open_prepared
    from minilmd.plan.growth import SegmentedSampler

    train = open_prepared(corpus[0]).train
    half = train.n_docs // 2
    old_tokens = int(train.doc_starts[half])
    old = make_sampler("packed", train.tokens[:old_tokens], train.doc_starts[:half + 1], 64, 5, doc_mask=True)
    new = make_sampler("packed", train.tokens, train.doc_starts, 64, 5, doc_mask=True)
    segments = [{"first_row": 0, "first_epoch": 0}, {"first_row": old.items_per_epoch, "first_epoch": 1}]
    both = SegmentedSampler(segments, [old, new])
    rows = np.arange(old.items_per_epoch - 2, old.items_per_epoch + 2)  # two rows of each version
    batch = both.rows(rows)
    assert batch.positions is not None
    want_old, want_new = old.rows(rows[:2]), new.rows(rows[2:] - old.items_per_epoch + new.items_per_epoch)
    np.testing.assert_array_equal(batch.positions, np.concatenate([want_old.positions, want_new.positions]))
    np.testing.assert_array_equal(batch.targets, np.concatenate([want_old.targets, want_new.targets]))
    assert batch.n_targets == want_old.n_targets + want_new.n_targets


@pytest.mark.slow
def test_the_flex_attention_path_computes_what_the_dense_mask_does(monkeypatch):
    """The block mask CUDA uses inside torch.compile, forced here on CPU (eager flex_attention, its reference
    implementation, forward only: it has no CPU backward): the same logits as the dense mask."""
    import warnings

    from minilmd.trainer.model import docattention

    row = torch.randint(3, VOCAB, (2, 64), generator=torch.Generator().manual_seed(3))
    positions = torch.from_numpy(window_positions(np.array([0, 30]), 64, np.array([0, 9, 32, 36, 51, 80, 128])))
    model = tiny_model()
    logits = {}
    for flex in (False, True):
        monkeypatch.setattr(docattention, "use_flex", lambda positions, flex=flex: flex)
        assert isinstance(docattention.masks_for(positions), docattention.BlockMask) == flex
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager flex_attention warns that it is slow
            logits[flex] = model(row, positions=positions).logits
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits[False], model(row).logits.detach(), atol=1e-4)  # the mask is in effect


@pytest.mark.slow
def test_two_gloo_ranks_match_one_rank_with_the_mask(tmp_path, corpus):
    from minilmd.protocol import EXIT_DONE as DONE
    from trainer_corpus import child_env, read_metrics, run_paths

    steps, data = 4, {"mode": "packed", "doc_mask": True}
    one = write_config(tmp_path, corpus, name="one", data=data, train={"max_steps": steps, "micro_batch_size": 4})
    two = write_config(tmp_path, corpus, name="two", data=data, train={"max_steps": steps, "micro_batch_size": 2})
    assert train_in_process(one).returncode == DONE
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "-m", "minilmd.cli", "train", str(two)], capture_output=True, text=True, timeout=300,
                       env=child_env())
    assert p.returncode == DONE, p.stdout[-3000:] + p.stderr[-3000:]
    lines_one, lines_two = read_metrics(run_paths(one)[0], "train"), read_metrics(run_paths(two)[0], "train")
    assert len(lines_one) == len(lines_two) == steps
    for a, b in zip(lines_one, lines_two, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-5)
        assert b["tokens_seen"] == a["tokens_seen"]
