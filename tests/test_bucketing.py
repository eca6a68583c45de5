"""Length bucketing and one-document rows, on numpy arrays: what minilmd/plan/bucketing.py promises.

Each epoch of the bucketed sampler visits every document at most once (all but n % mb), its micro-batches hold
documents of similar length padded only to their longest, its order is a pure function of (seed, step) that differs
from epoch to epoch, the global batch splits over ranks and micro-batches as the packed sampler's does, and the
counts the loss is weighted by (global_counts) are those of the rows. Chat rows carry their loss mask.
"""
import numpy as np
import pytest

from minilmd.corpus.analysis.stats import width_class
from minilmd.plan.bucketing import BucketedSampler, DocumentRows, PaddedSampler
from minilmd.plan.sampler_base import DataError
from minilmd.plan.samplers import make_sampler, validation_batches
from minilmd.protocol import BOS_ID, EOS_ID, PAD_ID


def chat_like(n_docs: int, seed: int = 0, seq_len: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, doc_starts, loss_mask): BOS, a 'user' run (mask 0), an 'assistant' run ending in EOS (mask 1),
    lengths mostly short with a long tail (some longer than seq_len, to be cut)."""
    rng = np.random.default_rng(seed)
    tokens, mask, lengths = [], [], []
    for _ in range(n_docs):
        user, reply = int(rng.integers(1, 12)), int(rng.lognormal(2.0, 0.9)) + 1
        ids = [BOS_ID, *rng.integers(3, 100, user).tolist(), *rng.integers(3, 100, reply).tolist(), EOS_ID]
        tokens += ids
        mask += [0] * (1 + user) + [1] * (reply + 1)
        lengths.append(len(ids))
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return np.asarray(tokens, np.uint16), starts, np.asarray(mask, np.uint8)


def test_a_bucketed_epoch_visits_each_document_once_in_tight_buckets():
    tokens, starts, mask = chat_like(203)
    s = BucketedSampler(tokens, starts, 64, seed=3, micro_batch_size=8, loss_mask=mask)
    n = s.items_per_epoch
    assert n == 200  # 203 - 203 % 8: three documents sit this epoch out
    lengths = np.minimum(np.diff(starts), 64)
    epochs = []
    for e in range(2):
        docs, _ = s.order.items(np.arange(e * n, (e + 1) * n))
        assert len(set(docs.tolist())) == n  # no document twice
        buckets = docs.reshape(-1, 8)
        # Sorted by length, then cut: no two buckets overlap in length except at their edges.
        spans = sorted((int(lengths[b].min()), int(lengths[b].max())) for b in buckets)
        assert all(hi <= next_lo for (_, hi), (next_lo, _) in zip(spans, spans[1:], strict=False))
        epochs.append(docs)
    assert not np.array_equal(epochs[0], epochs[1])  # another tie order, other left-outs, another bucket order
    b = s.batch(5, 16, micro=1, micro_batch_size=8)  # one micro-batch is one bucket
    docs, _ = s.order.items(np.arange(5 * 16 + 8, 5 * 16 + 16))
    longest = int(lengths[docs].max())
    assert b.input_ids.shape == (8, width_class(longest, 64)) and width_class(longest, 64) % 8 == 0
    assert (b.input_ids[:, longest:] == PAD_ID).all() and (b.targets[:, longest:] == 0).all()  # no loss on them
    assert b.n_real_tokens == int((b.input_ids != PAD_ID).sum()) == int(lengths[docs].sum())
    padded = PaddedSampler(tokens, starts, 64, seed=3, loss_mask=mask)
    # Widths rounded up to multiples of 8 at seq_len 64 cost some PAD on these short rows (~18 tokens), still a
    # fraction of static padding's.
    assert s.pad_share(micro_batch_size=8) < 0.25 < 0.5 < padded.pad_share()


def test_bucketed_order_is_a_pure_function_of_seed_and_step_and_splits_like_packing():
    tokens, starts, mask = chat_like(300, seed=1)
    s = make_sampler("bucketed", tokens, starts, 64, 11, mask, micro_batch_size=4)
    fresh = make_sampler("bucketed", tokens, starts, 64, 11, mask, micro_batch_size=4)
    other = make_sampler("bucketed", tokens, starts, 64, 12, mask, micro_batch_size=4)
    for step in (0, 7, 40, 75):  # 75 * 16 rows: past the first epoch (296 rows)
        whole = s.rows(np.arange(step * 16, (step + 1) * 16))
        micros = [fresh.batch(step, 16, rank=r, world_size=2, micro=m, micro_batch_size=4)
                  for r in range(2) for m in range(2)]
        assert sum(m.n_targets for m in micros) == whole.n_targets == s.global_counts(step * 16, 16)[0]
        assert sum(m.n_real_tokens for m in micros) == whole.n_real_tokens == s.global_counts(step * 16, 16)[1]
        # Each micro-batch holds exactly its rows of the global batch, padded less.
        width = max(m.input_ids.shape[1] for m in micros)
        stacked = np.concatenate([np.pad(m.input_ids, ((0, 0), (0, width - m.input_ids.shape[1]))) for m in micros])
        assert np.array_equal(stacked, whole.input_ids[:, :width]) and not whole.input_ids[:, width:].any()
    assert not np.array_equal(s.batch(0, 16).input_ids, other.batch(0, 16).input_ids)


def test_chat_rows_carry_the_mask_and_are_cut_at_seq_len():
    tokens, starts, mask = chat_like(80, seed=2)
    rows = DocumentRows(tokens, starts, 24, mask)
    for d in range(80):
        ids, targets = rows.row(d)
        begin = int(starts[d])
        n = min(int(starts[d + 1]) - begin, 24)
        assert np.array_equal(ids, tokens[begin:begin + n]) and np.array_equal(targets, mask[begin:begin + n])
        assert rows.n_targets[d] == int(targets[1:].sum()) and rows.lengths[d] == n
    assert (np.diff(starts) > 24).any(), "the fixture must hold documents longer than seq_len"
    b = PaddedSampler(tokens, starts, 24, seed=0, loss_mask=mask).batch(0, 8)
    assert b.input_ids.shape == (8, 24)
    assert b.n_targets == int(b.targets[:, 1:].sum()) and not b.targets[b.input_ids == PAD_ID].any()
    labels = b.labels
    assert (labels[b.targets == 1] == b.input_ids[b.targets == 1]).all() and (labels[b.targets == 0] == -100).all()


def test_text_documents_bucket_into_minimind_s_rows():
    tokens, starts, _ = chat_like(50, seed=4)
    bucketed = BucketedSampler(tokens, starts, 16, seed=0, micro_batch_size=5)
    padded = PaddedSampler(tokens, starts, 16, seed=0)
    b = bucketed.rows(np.arange(50))
    p = padded.rows(np.arange(50))
    key = lambda batch: sorted(tuple(r[r != PAD_ID].tolist()) for r in batch.input_ids)
    assert key(b) == key(p)  # the same rows, only padded less
    assert (b.input_ids[:, 0] == BOS_ID).all() and ((b.input_ids == EOS_ID).sum(axis=1) == 1).all()
    assert b.n_targets == p.n_targets == int(np.minimum(np.diff(starts), 16).sum()) - 50


def test_validation_bucketed_uses_the_padded_documents_in_tight_batches():
    tokens, starts, mask = chat_like(100, seed=5)
    padded = validation_batches("padded", tokens, starts, 64, 20, 4, mask)
    bucketed = validation_batches("bucketed", tokens, starts, 64, 20, 4, mask)
    assert sum(b.n_targets for b in padded) == sum(b.n_targets for b in bucketed)
    assert sum(b.input_ids.size for b in bucketed) < sum(b.input_ids.size for b in padded)


def test_bucketed_mode_refuses_a_corpus_smaller_than_one_bucket():
    tokens, starts, mask = chat_like(3)
    with pytest.raises(DataError, match="fewer than one micro-batch"):
        BucketedSampler(tokens, starts, 64, seed=0, micro_batch_size=4, loss_mask=mask)
