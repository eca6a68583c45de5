"""status and plot read another user's metrics.jsonl/events.jsonl with bounded memory (hostile audit 1): status its
last STATUS_METRICS_LINES lines, plot a summary thinned per kind while it streams, never every line as a dict."""
from __future__ import annotations

import json
import tracemalloc

import pytest

from minilmd.daemon.views import curves, fitwatch


def _write_train_lines(path, count: int) -> None:
    path.write_text("".join(json.dumps({"kind": "train", "step": s, "loss": 2.0, "epoch": 0}) + "\n"
                            for s in range(1, count + 1)))


def _peak(fn) -> tuple[object, int]:
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # 30,000 lines parsed under tracemalloc
def test_status_reads_the_last_lines_only(tmp_path):
    _write_train_lines(tmp_path / "metrics.jsonl", 30_000)
    lines, peak = _peak(lambda: fitwatch.fit_lines(tmp_path))
    assert "20000 logs" in lines[0], lines  # STATUS_METRICS_LINES, not the file's 30000
    assert peak < 24 << 20, peak  # every line a dict took ~40 MB


def test_plot_keeps_a_thinned_bounded_summary(tmp_path, monkeypatch):
    monkeypatch.setattr(curves, "PLOT_MAX_RECORDS", 250, raising=False)
    _write_train_lines(tmp_path / "metrics.jsonl", 10_000)
    (tmp_path / "events.jsonl").write_text(json.dumps({"event": "sync", "message": "synced step 1"}) + "\n" * 1
                                           + '{"event": "x"}\n' * 5_000)
    run, peak = _peak(lambda: curves.load(tmp_path))
    steps = [r["step"] for r in run.train]
    assert len(steps) <= 251 and steps[0] == 1 and steps[-1] == 10_000  # spread over the run, its end kept
    assert max(b - a for a, b in zip(steps, steps[1:], strict=False)) <= 64  # evenly: no gap of more than a stride
    assert peak < 3 << 20, peak  # 10,000 train and 5,000 event dicts held before


def test_sample_keeps_each_kinds_last_and_bounds_kinds():
    sample = curves.Sample("kind", cap=4, max_kinds=2)
    for i in range(100):
        sample.add({"kind": f"k{i}", "i": i})  # a flood of made-up kinds: one group past max_kinds
    sample.add({"kind": "lineage", "i": 100})
    assert sample.kept() <= 3 * 5
    kept = sample.records()
    assert kept[-1]["i"] == 100 and [r["i"] for r in kept] == sorted(r["i"] for r in kept)


def test_stream_lines_holds_one_block_and_skips_what_it_cannot_hold(tmp_path, monkeypatch):
    from minilmd import logread

    monkeypatch.setattr(logread, "STREAM_BLOCK", 16)
    path = tmp_path / "log"
    path.write_bytes(b"cut-by-the-window\n" + b"a\n" + b"x" * 40 + b"\n" + b"b\n" + b"torn")
    window = path.stat().st_size - 3  # the window begins inside the first line
    assert list(logread.stream_lines(path, window)) == [b"a", b"b", b"torn"]  # the 40-byte line: longer than a block
    assert list(logread.stream_lines(tmp_path / "missing", 100)) == []
    whole = tmp_path / "whole"
    whole.write_bytes(b"a\nb\nc\n")
    assert list(logread.stream_lines(whole, 4)) == [b"b", b"c"]  # a window that begins at a line's start keeps it
    assert list(logread.stream_lines(whole, 3)) == [b"c"]
