"""The one exponential backoff (minilmd/backoff.py) and the figures the docs quote from it."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from minilmd import backoff
from minilmd.backoff import exponential
from minilmd.daemon.base import knobs

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_it_doubles_from_its_first_wait_up_to_its_cap():
    assert [exponential(5.0, n) for n in (1, 2, 3, 4)] == [5.0, 10.0, 20.0, 40.0]
    assert [exponential(5.0, n, cap_s=12.0) for n in (1, 2, 3, 9)] == [5.0, 10.0, 12.0, 12.0]
    assert exponential(1.0, 0) == exponential(1.0, -3) == 1.0  # a retry before the first waits the first


def test_a_jitter_draws_between_half_and_all_of_the_wait():
    rng = random.Random(0)
    waits = [exponential(4.0, 3, cap_s=10.0, rng=rng) for _ in range(200)]
    assert all(10.0 * backoff.JITTER_LOW <= w <= 10.0 for w in waits) and len(set(waits)) > 1


def test_a_staging_copy_retried_many_times_waits_no_longer_than_its_cap(tmp_path, monkeypatch):
    """Before, the copy's wait grew without a bound (backoff_s * 2**n): retries=12 slept 2048 s in the staging
    thread before its last try."""
    from minilmd.daemon.jobs import staging

    class Failing:  # a remote source (not a local fs) whose every open fails: an NFS gone
        protocol = "memory"

        def open(self, *_a, **_k):
            raise OSError(5, "Input/output error")

    slept: list[float] = []
    monkeypatch.setattr(staging.time, "sleep", slept.append)  # the copy's waits, recorded instead of slept
    copier = staging._Copier(Failing(), "/src", "/src", 10, lambda _p: None, retries=12, backoff_s=1.0,
                             log=lambda _m: None)
    with pytest.raises(staging.StagingError):  # SourceUnreachable: every try failed reading the source
        copier.copy("a.bin", {"size": 10, "sha256": "0" * 64}, tmp_path / "a.bin")
    assert slept[:4] == [1.0, 2.0, 4.0, 8.0] and len(slept) == 12
    assert max(slept) == backoff.STAGING_COPY_MAX_S, slept


def test_the_docs_quote_the_figures_the_code_uses():
    first = backoff.SYNC_RETRY_FIRST_S
    stalled = f"over {knobs.SYNC_STALLED_AFTER.default_s:g} s"
    for doc, sync_words in (("architecture.md", f"after {first:g} s, {2 * first:g} s, {4 * first:g} s ... up to"),
                            ("operations.md", f"after {first:g} s, {2 * first:g} s, ... up to")):
        assert sync_words in (DOCS / doc).read_text() and stalled in (DOCS / doc).read_text(), doc
    copy = [backoff.exponential(backoff.STAGING_COPY_FIRST_S, n) for n in range(1, backoff.STAGING_COPY_RETRIES + 1)]
    copy_words = f"{backoff.STAGING_COPY_RETRIES} retries, " + ", ".join(f"{w:g} s" for w in copy) + " apart"
    assert copy_words in (DOCS / "failure-modes.md").read_text()


def test_a_retry_counted_past_a_thousand_still_waits_its_cap():
    """A sync failing every minute through a long outage counts past 1,024 failures: 2.0 ** 1,100 raised
    OverflowError in the supervisor's loop."""
    assert exponential(5.0, 1100, cap_s=900.0) == 900.0
    assert exponential(1.0, 10 ** 6) == 2.0 ** 64
