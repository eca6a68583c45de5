"""The packed and padded samplers: determinism, coverage, rank splits, MiniMind's padded rows, validation set."""
import numpy as np
import pytest

from minilmd.plan.bucketing import PaddedSampler, padded_row
from minilmd.plan.sampler_base import IGNORE_INDEX, DataError
from minilmd.plan.samplers import PackedSampler, make_sampler, validation_batches
from minilmd.protocol import BOS_ID, EOS_ID, PAD_ID


def synthetic_stream(n_docs: int, seed: int = 0, mean_len: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """[BOS] doc [EOS] ... with random inner ids in [3, 100); returns (tokens uint16, doc_starts)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 2 * mean_len, size=n_docs) + 2
    parts = []
    for n in lengths:
        parts += [BOS_ID, *rng.integers(3, 100, size=n - 2).tolist(), EOS_ID]
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return np.asarray(parts, dtype=np.uint16), starts


def test_packed_epoch_visits_every_window_once_with_a_moving_offset():
    tokens = np.arange(1000, dtype=np.uint16)  # token value == its position: a window start is its first token
    s = PackedSampler(tokens, seq_len=16, seed=7)
    n = s.items_per_epoch
    assert n == (1000 - 16 + 1) // 16
    offsets = set()
    for epoch in range(3):
        starts = s.window_starts(np.arange(epoch * n, (epoch + 1) * n))
        offset = int(starts.min())
        offsets.add(offset)
        assert 0 <= offset < 16
        assert sorted(starts.tolist()) == [offset + k * 16 for k in range(n)]
        assert starts.max() + 16 <= 1000
    assert len(offsets) > 1, "the window edges should move between epochs"


@pytest.mark.parametrize("seq_len", [1, 16, 300])
def test_the_packed_minimum_named_is_the_smallest_split_the_sampler_takes(seq_len):
    def sampler(n_tokens: int) -> PackedSampler:
        return PackedSampler(np.zeros(n_tokens, dtype=np.uint16), seq_len=seq_len, seed=0)

    with pytest.raises(DataError) as refused:
        sampler(0)
    named = int(str(refused.value).split(" = ")[1].split(" ")[0].replace(",", ""))  # "needs at least ... = N (..."
    assert sampler(named).items_per_epoch == 1
    with pytest.raises(DataError):
        sampler(named - 1)


def test_windows_hold_seq_len_stream_tokens_and_labels_equal_inputs():
    tokens = np.arange(1000, dtype=np.uint16)
    b = PackedSampler(tokens, seq_len=16, seed=1).batch(step=3, global_batch=4)
    assert b.input_ids.shape == (4, 16) and b.input_ids.dtype == np.uint16 and b.targets is None
    assert np.array_equal(b.input_ids[:, 1:], b.labels[:, 1:])  # every token but a row's first is a target
    assert (np.diff(b.input_ids, axis=1) == 1).all()  # consecutive stream positions
    assert b.n_targets == 4 * 15 and b.n_real_tokens == 64


def test_batch_is_a_pure_function_of_seed_and_step():
    tokens, _ = synthetic_stream(300)
    a = PackedSampler(tokens, 32, seed=3)
    for step in (0, 5, 17, 400):  # 400 is several epochs in
        fresh = PackedSampler(tokens, 32, seed=3)
        assert np.array_equal(a.batch(step, 8).input_ids, fresh.batch(step, 8).input_ids)
    other = PackedSampler(tokens, 32, seed=4)
    assert not np.array_equal(a.batch(0, 8).input_ids, other.batch(0, 8).input_ids)


@pytest.mark.parametrize("mode", ["packed", "padded"])
def test_same_global_batch_for_one_and_two_ranks_and_micro_batches(mode):
    tokens, starts = synthetic_stream(200)
    s = make_sampler(mode, tokens, starts, 24, seed=11)
    for step in (0, 9, 123):
        whole = s.batch(step, 8)
        ranks = [s.batch(step, 8, rank=r, world_size=2) for r in range(2)]
        assert np.array_equal(whole.input_ids, np.concatenate([r.input_ids for r in ranks]))
        assert np.array_equal(whole.labels, np.concatenate([r.labels for r in ranks]))
        micro = [s.batch(step, 8, rank=1, world_size=2, micro=m, micro_batch_size=2) for m in range(2)]
        assert np.array_equal(ranks[1].input_ids, np.concatenate([m.input_ids for m in micro]))
        assert (whole.n_targets, whole.n_real_tokens) == s.global_counts(step * 8, 8)
        assert whole.n_targets == sum(r.n_targets for r in ranks)
        assert np.array_equal(s.batch(step + 1, 8).input_ids, s.batch(0, 8, first_row=(step + 1) * 8).input_ids)


def test_steps_across_an_epoch_boundary_are_the_concatenation_of_epoch_permutations():
    tokens = np.arange(200, dtype=np.uint16)
    s = PackedSampler(tokens, seq_len=10, seed=2)  # 19 windows per epoch
    n = s.items_per_epoch
    rows = np.concatenate([s.batch(step, 4).input_ids[:, 0] for step in range(10)])  # 40 rows: 2 epochs and 2
    first = s.window_starts(np.arange(0, n))
    second = s.window_starts(np.arange(n, 2 * n))
    assert rows[:n].tolist() == first.tolist()
    assert rows[n:2 * n].tolist() == second.tolist()


def test_bad_splits_are_refused_with_numbers():
    tokens = np.arange(1000, dtype=np.uint16)
    s = PackedSampler(tokens, 16, seed=0)
    with pytest.raises(DataError, match="3 ranks"):
        s.batch(0, 8, world_size=3)
    with pytest.raises(DataError, match="micro-batch"):
        s.batch(0, 8, micro=0, micro_batch_size=3)
    with pytest.raises(DataError, match="20 tokens"):
        PackedSampler(np.arange(20, dtype=np.uint16), 16, seed=0)


def test_padded_row_is_minimind_s():
    tokens = np.array([BOS_ID, 10, 11, 12, EOS_ID, BOS_ID, *range(20, 40), EOS_ID], dtype=np.uint16)
    row, n = padded_row(tokens, 0, 5, seq_len=8)
    assert row.tolist() == [BOS_ID, 10, 11, 12, EOS_ID, PAD_ID, PAD_ID, PAD_ID] and n == 5
    long_row, n = padded_row(tokens, 5, len(tokens), seq_len=8)  # 20 inner ids truncated to 6
    assert long_row.tolist() == [BOS_ID, 20, 21, 22, 23, 24, 25, EOS_ID] and n == 8


def test_padded_labels_ignore_pad_and_keep_eos():
    tokens, starts = synthetic_stream(50, mean_len=6)
    s = PaddedSampler(tokens, starts, seq_len=16, seed=0)
    b = s.batch(0, 8)
    pad = b.input_ids == PAD_ID
    assert pad.any(), "short documents must be padded"
    assert (b.labels[pad] == IGNORE_INDEX).all()
    real = ~pad
    real[:, 0] = False  # a row's first token is never predicted
    assert np.array_equal(b.labels[real], b.input_ids[real])
    assert (b.input_ids[:, 0] == BOS_ID).all()
    assert ((b.labels == EOS_ID).sum(axis=1) == 1).all()  # every row keeps its EOS target
    assert b.n_real_tokens == int((~pad).sum())
    assert b.n_targets == int((b.labels[:, 1:] != IGNORE_INDEX).sum())


def test_padded_epoch_visits_every_document_once():
    tokens, starts = synthetic_stream(37, mean_len=5)
    s = PaddedSampler(tokens, starts, seq_len=64, seed=5)  # long enough: no truncation
    rows = s.rows(np.arange(37))
    lengths = sorted(int((r != PAD_ID).sum()) for r in rows.input_ids)
    assert lengths == sorted(np.diff(starts).tolist())
    assert 0.0 < s.pad_share() < 1.0


@pytest.mark.parametrize("mode", ["packed", "padded"])
def test_validation_set_is_fixed_and_independent_of_the_run_seed(mode):
    tokens, starts = synthetic_stream(100)
    a = validation_batches(mode, tokens, starts, seq_len=16, n_windows=10, batch_size=4)
    b = validation_batches(mode, tokens, starts, seq_len=16, n_windows=10, batch_size=4)
    assert [len(x.input_ids) for x in a] == [4, 4, 2]
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.input_ids, y.input_ids)


def test_validation_on_a_split_shorter_than_a_window_uses_one_short_row():
    tokens = np.array([BOS_ID, 5, 6, EOS_ID], dtype=np.uint16)
    (b,) = validation_batches("packed", tokens, np.array([0, 4]), seq_len=16, n_windows=8, batch_size=4)
    assert b.input_ids.tolist() == [[BOS_ID, 5, 6, EOS_ID]] and b.n_targets == 3
