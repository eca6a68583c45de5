"""What the trainer's start spends on an SFT corpus's rows and its count of the replies train.seq_len cuts
(minilmd/plan/bucketing.py DocumentRows, then check_replies_fit's count), on a synthetic chat split: N documents of
uniform random length in [64, 1024], a random loss mask, train.seq_len 512 (about 57% of the documents cut).

Runs against whichever minilmd is on the path, so that the code before and after a change can be timed on the same
index: before, the count looped over every cut document a second time (replycut.rows_cut); now DocumentRows keeps
each document's lost targets from its one pass. The median of `--repeats`.
`.venv/bin/python scripts/replycut_start_cost.py [--docs N] [--repeats N]`
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _start(tokens, starts, mask, seq_len: int) -> tuple[float, float, object]:
    """(seconds of DocumentRows, seconds of the count, the count)."""
    from minilmd.plan.bucketing import DocumentRows

    t0 = time.perf_counter()
    rows = DocumentRows(tokens, starts, seq_len, mask)
    t1 = time.perf_counter()
    if hasattr(rows, "replies_cut"):  # now: the rows' own counts
        cut = rows.replies_cut()
    else:  # before: a second loop over the cut documents
        from minilmd.replycut import rows_cut
        cut = rows_cut(rows.n_targets, np.diff(rows.doc_starts), mask, rows.doc_starts, seq_len)
    return t1 - t0, time.perf_counter() - t1, cut


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths = rng.integers(64, 1025, args.docs)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    mask = rng.integers(0, 2, int(starts[-1]), dtype=np.uint8)
    tokens = np.zeros(1, np.uint16)  # not read by the counts
    runs = [_start(tokens, starts, mask, 512) for _ in range(args.repeats)]
    rows_s, count_s = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
    print(f"{args.docs:,} documents, {int((lengths > 512).sum()):,} cut: DocumentRows {rows_s:.2f} s, count "
          f"{count_s:.2f} s, start {rows_s + count_s:.2f} s; {runs[0][2]}")


if __name__ == "__main__":
    main()
