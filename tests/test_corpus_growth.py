"""A run resumed on a corpus that grew by `prepare --append` (minilmd/plan/growth.py): not refused, the rows
already planned unchanged up to the end of the epoch it was in, the new documents from the next epoch on; a corpus
changed any other way is still refused."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from data_helpers import read_texts, write_jsonl
from in_process import train_in_process
from minilmd.checkpoint import CheckpointMismatch, Expectation, check_expectation
from minilmd.corpus.format import open_prepared
from minilmd.corpus.prepare.append import append
from minilmd.corpus.prepare.pipeline import prepare
from minilmd.plan import growth
from minilmd.plan.samplers import make_sampler
from trainer_corpus import read_metrics, resumed_step, train, write_config

SEQ, GLOBAL = 64, 8  # write_config's seq_len and micro_batch_size x grad_accum


def _grow(tmp_path, demo_jsonl, tokenizer):
    texts = read_texts(demo_jsonl)
    old, new = write_jsonl(tmp_path / "old.jsonl", texts[:20]), write_jsonl(tmp_path / "new.jsonl", texts[300:360])
    root = tmp_path / "corpus"
    prepare([str(old)], tokenizer, root, val_fraction=0.1, workers=0, progress=False, log=lambda m: None)
    return root, new


def test_segments_keep_the_planned_rows(tmp_path, demo_jsonl, tokenizer):
    root, new = _grow(tmp_path, demo_jsonl, tokenizer)
    before = open_prepared(root)
    old_sampler = make_sampler("packed", np.array(before.train.tokens), before.train.doc_starts, SEQ, 7)
    state = {"fingerprints": {"data": before.data_fingerprint}, "rows_seen": 3 * GLOBAL,
             "data_segments": growth.one_segment(before)}
    append([str(new)], root, workers=0, progress=False, log=lambda m: None)
    grown = open_prepared(root)
    plain = make_sampler("packed", grown.train.tokens, grown.train.doc_starts, SEQ, 7)
    sampler = growth.resume_sampler(state, grown, "packed", SEQ, 7, plain)
    n_old = old_sampler.items_per_epoch
    assert isinstance(sampler, growth.SegmentedSampler) and sampler.segments[1]["first_row"] == n_old
    rows = np.arange(0, n_old, dtype=np.int64)
    assert np.array_equal(sampler.rows(rows).input_ids, old_sampler.rows(rows).input_ids)
    after = np.arange(n_old, n_old + 4 * plain.items_per_epoch, dtype=np.int64)
    assert np.array_equal(sampler.rows(after).input_ids, plain.rows(after - n_old + plain.items_per_epoch).input_ids)
    # the new documents are read from then on: some window starts past the old train split's end
    assert (plain.window_starts(after - n_old + plain.items_per_epoch) >= before.train.n_tokens).any()
    # a batch that straddles the boundary: each row from its own version, one uint16 array, targets as packed rows
    across = np.arange(n_old - 2, n_old + 2, dtype=np.int64)
    both = sampler.rows(across)
    assert both.input_ids.dtype == np.uint16
    assert np.array_equal(both.input_ids[:2], old_sampler.rows(across[:2]).input_ids)
    assert np.array_equal(both.input_ids[2:], plain.rows(across[2:] - n_old + plain.items_per_epoch).input_ids)
    assert both.targets is not None and not both.targets[:, 0].any() and both.targets[:, 1:].all()
    assert both.n_targets == int(both.targets.sum()) == 4 * (SEQ - 1)
    # a resume after the boundary keeps the same segments (they travel in trainer_state.json)
    later = {**state, "fingerprints": {"data": grown.data_fingerprint}, "data_segments": sampler.segments}
    assert growth.resume_sampler(later, grown, "packed", SEQ, 7, plain).segments == sampler.segments

    # the checkpoint check: an earlier version of this corpus is accepted, any other data is refused
    exp = Expectation(data_fingerprint=grown.data_fingerprint, data_ancestors=tuple(grown.earlier_versions))
    check_expectation(tmp_path, {"fingerprints": {"data": before.data_fingerprint}}, exp)
    with pytest.raises(CheckpointMismatch, match="data fingerprint differs"):
        check_expectation(tmp_path, {"fingerprints": {"data": "f" * 64}}, exp)


@pytest.mark.slow
def test_resume_across_an_append_is_bit_exact_until_the_next_epoch(tmp_path, demo_jsonl, tokenizer):
    root, new = _grow(tmp_path, demo_jsonl, tokenizer)
    vocab = open_prepared(root).vocab_size
    n_old = open_prepared(root).train.n_tokens
    undisturbed_corpus = tmp_path / "undisturbed-corpus"
    shutil.copytree(root, undisturbed_corpus)
    windows = (n_old - SEQ + 1) // SEQ  # rows per epoch of the old corpus: the boundary
    assert windows > 4 * GLOBAL  # past the resume
    last = windows // GLOBAL + 4  # the test straddles the boundary
    steps = {"max_steps": last, "checkpoint_every": 2, "warmup_steps": 2, "seed": 7}
    plain = write_config(tmp_path, (undisturbed_corpus, vocab), "plain", train=steps)
    grown = write_config(tmp_path, (root, vocab), "grown", train=steps)
    assert train_in_process(plain).returncode == 0
    first = train(grown, MINILMD_FAULT="sigkill@5")  # killed before step 5: its last checkpoint is step 2 or 4
    assert first.returncode == -9, first.stderr
    append([str(new)], root, workers=0, progress=False, log=lambda m: None)
    second = train_in_process(grown)
    assert second.returncode == 0, second.stderr
    resumed = resumed_step(second.stdout)
    assert resumed in (2, 4), second.stdout

    ref = {m["step"]: m["loss"] for m in read_metrics(tmp_path / "plain" / "run", "train")}
    got = {m["step"]: m["loss"] for m in read_metrics(tmp_path / "grown" / "run", "train")}
    before = [s for s in got if s > resumed and s * GLOBAL <= windows]  # step s trains rows [(s-1)*8, s*8)
    after = [s for s in got if (s - 1) * GLOBAL >= windows]
    assert before and after
    assert [got[s] for s in before] == [ref[s] for s in before]  # bit-exact: the same rows, the same floats
    assert any(got[s] != ref[s] for s in after)  # the new documents came in


def test_staging_fetches_only_the_appended_part(tmp_path, demo_jsonl, tokenizer):
    import json

    from minilmd.daemon.jobs.staging import stage, verify_staged

    root, new = _grow(tmp_path, demo_jsonl, tokenizer)
    scratch = tmp_path / "scratch"
    final = stage(str(root), scratch)
    old_files = json.loads((root / "meta.json").read_text())["files"]
    append([str(new)], root, workers=0, progress=False, log=lambda m: None)
    files = json.loads((root / "meta.json").read_text())["files"]
    seen = []
    final = stage(str(root), scratch, progress=seen.append)
    # the grown tokens.bin files: only their tails; doc_lengths.npy (rewritten by the append): whole
    tails = sum(files[f]["size"] - old_files[f]["size"] for f in ("train/tokens.bin", "val/tokens.bin"))
    whole = sum(files[f]["size"] for f in ("train/doc_lengths.npy", "val/doc_lengths.npy"))
    assert seen and seen[-1].total_bytes == tails + whole == seen[-1].done_bytes
    assert verify_staged(final) == []
    for f in files:
        assert (final / f).read_bytes() == (root / f).read_bytes()
