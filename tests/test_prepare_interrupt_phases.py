"""Ctrl-C in `minilmd prepare` at any moment says one line (found by a new user: at about 4 s, while the encoding
workers were starting, `prepare: interrupted, nothing written` was followed by a worker's KeyboardInterrupt
traceback and another ending `pickle data was truncated`; at 9 s it was clean). The workers now start with the stop
signals held and ignore Ctrl-C before anything else (minilmd/corpus/workers.py), and the parent finishes handing a
worker its start before its own KeyboardInterrupt. A real process group gets SIGINT, as a terminal sends it, at
each moment tests/held_corpus_cli.py holds the command at."""
from __future__ import annotations

import re

import pytest

from held_interrupt import interrupt_at

PROGRESS = re.compile(r"prepare: +[0-9.]+% ")  # its progress line (minilmd/corpus/progress.py), off a terminal

pytestmark = pytest.mark.slow  # a real command and its workers in subprocesses


@pytest.mark.parametrize("phase", ["worker-start", "encode", "write"])
def test_ctrl_c_at_any_moment_of_prepare_says_one_line_and_leaves_nothing(tmp_path, demo_jsonl, tokenizer, phase):
    out = tmp_path / "out"
    status, said = interrupt_at(tmp_path, phase, ["prepare", *demo_jsonl, "--tokenizer", str(tokenizer), "--out",
                                                  str(out), "--seq-len", "64", "--workers", "2", "--val-fraction",
                                                  "0.05"])
    lines = [line for line in said.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert (status, lines) == (130, ["prepare: interrupted, nothing written"]), said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held", "stderr"]  # no output, no temp dir, no lock
