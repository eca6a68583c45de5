"""A supervisor's start looked at scratch's newest checkpoint twice, hashing it each time: at launch (`run --check`'s
rule, daemon/jobs/resumefrom.py) and in staging (daemon/jobs/scratch_behind.py), seconds apart; 14 s a look for a
200M-parameter model on a loaded machine (scripts/scratch_start_cost.py). Now the second look reuses the first's
validation (checkpoint_select.validate_once), but only of a checkpoint nothing changed since: a byte flipped in
place, with its mtime put back, is seen and refused; another expectation, or an old validation, hashes again."""
from __future__ import annotations

import os

import pytest

from minilmd import checkpoint_select
from minilmd.checkpoint import CheckpointMismatch, Expectation
from minilmd.daemon.jobs.scratch_behind import scratch_newest
from minilmd.names import MODEL_FILE
from sync_helpers import EXPECTED, corrupt, save, weights  # noqa: F401  (fixtures)


@pytest.fixture
def hashed(monkeypatch) -> list[str]:
    """The checkpoints validated (hashed), in order; nothing remembered from another test."""
    monkeypatch.setattr(checkpoint_select, "_validated", {})
    seen: list[str] = []
    real = checkpoint_select.validate

    def counting(path, expected=None):
        seen.append(os.path.basename(path))
        return real(path, expected)

    monkeypatch.setattr(checkpoint_select, "validate", counting)
    return seen


def test_a_starts_second_look_at_an_unchanged_checkpoint_hashes_nothing(tmp_path, weights, hashed):
    scratch = tmp_path / "checkpoints"
    save(scratch, 3, weights)
    assert scratch_newest(scratch, EXPECTED) == 3 and scratch_newest(scratch, EXPECTED) == 3
    assert hashed == ["step-00000003"]  # before: hashed twice
    other = Expectation(**{**vars(EXPECTED), "data_fingerprint": "e" * 64})  # another corpus: judged again
    with pytest.raises(CheckpointMismatch):
        scratch_newest(scratch, other)
    assert hashed == ["step-00000003"] * 2


def test_a_checkpoint_changed_in_place_since_the_first_look_is_hashed_again_and_refused(tmp_path, weights, hashed):
    scratch = tmp_path / "checkpoints"
    save(scratch, 2, weights)
    newest = save(scratch, 3, weights)
    assert scratch_newest(scratch, EXPECTED) == 3
    model = newest / MODEL_FILE
    st = os.stat(model)
    corrupt(model)  # same size, and the same mtime put back: only its ctime tells
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(model).st_size == st.st_size and os.stat(model).st_mtime_ns == st.st_mtime_ns
    assert scratch_newest(scratch, EXPECTED) == 2  # step 3 hashed again: damaged, passed by
    assert hashed == ["step-00000003", "step-00000003", "step-00000002"]


def test_a_validation_older_than_its_time_is_made_again(tmp_path, weights, hashed, monkeypatch):
    scratch = tmp_path / "checkpoints"
    save(scratch, 1, weights)
    monkeypatch.setattr(checkpoint_select, "REUSE_FOR_S", 0.0)
    assert scratch_newest(scratch, EXPECTED) == 1 and scratch_newest(scratch, EXPECTED) == 1
    assert hashed == ["step-00000001"] * 2
