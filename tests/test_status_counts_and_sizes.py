"""Counts and sizes in words a person reads (found by a new user: `checked 1 times` in status's waits, and run.dir's
free space as `1.01e+03 KiB free`)."""
from __future__ import annotations

import io
import time

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.views.status import status
from minilmd.fmt import fmt_times
from minilmd.fsio import atomic_write_json
from minilmd.untrusted import size_text


def test_a_count_of_times_reads_as_words():
    assert [fmt_times(n) for n in (0, 1, 2, 3, 1_200)] == ["0 times", "once", "twice", "3 times", "1,200 times"]


def test_a_size_under_the_next_unit_is_written_in_full_never_in_exponent_form():
    assert size_text(1010 * 1024) == "1,010 KiB"  # main: 1.01e+03 KiB
    assert size_text(1023 * 1024 + 1000) == "1,024 KiB"
    assert size_text(1023488) == "1,000 KiB" and size_text(1023488 << 10) == "1,000 MiB"  # .3g wrote "1e+03 KiB"
    assert size_text(1 << 20) == "1 MiB" and size_text(64 * 1024) == "64 KiB" and size_text(300) == "300 bytes"
    assert size_text(1536) == "1.5 KiB" and size_text(999 * (1 << 30)) == "999 GiB"
    assert size_text(1500 * (1 << 30)) == "1,500 GiB"


def _status(tmp_path, **fields) -> str:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state = new_state("r", run_dir, str(tmp_path / "r.toml"))
    state.update(**fields)
    atomic_write_json(run_dir / names.STATE, state)
    out = io.StringIO()
    assert status(run_dir, out=out) == 0
    return out.getvalue()


def test_a_wait_checked_once_says_once(tmp_path):
    t = time.time()
    said = _status(tmp_path, phase="waiting_space", since=t,
                   space_wait={"since": t, "needs": 3_000_000, "free": 1_000_000, "path": "/scratch", "checks": 1})
    assert "1.0 MB free in /scratch; checked once; the trainer starts again" in said, said  # main: checked 1 times


def test_a_wait_for_init_from_checked_once_says_once(tmp_path):
    t = time.time()
    said = _status(tmp_path, phase="waiting_init", since=t,
                   init_wait={"since": t, "checks": 1, "run": "pre", "run_dir": "/runs/pre", "root": "/runs",
                              "why": "predecessor pre is training"})
    assert "(run dir /runs/pre; checked once since " in said, said
