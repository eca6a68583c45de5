"""Ctrl-C in `minilmd prepare` at any moment says one line (found by a new user: at about 4 s, while the encoding
workers were starting, `prepare: interrupted, nothing written` was followed by a worker's KeyboardInterrupt
traceback and another ending `pickle data was truncated`; at 9 s it was clean). The workers now start with the stop
signals held and ignore Ctrl-C before anything else (minilmd/corpus/workers.py), and the parent finishes handing a
worker its start before its own KeyboardInterrupt. A real process group gets SIGINT, as a terminal sends it, at
each moment tests/held_corpus_cli.py holds the command at."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import procs
from waiting import wait_until

HELD_CLI = Path(__file__).with_name("held_corpus_cli.py")
PROGRESS = re.compile(r"prepare: +[0-9.]+% ")  # its progress line (stream.Progress), every 10 s off a terminal

pytestmark = pytest.mark.slow  # a real command and its workers in subprocesses


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("phase", ["worker-start", "encode", "write"])
def test_ctrl_c_at_any_moment_of_prepare_says_one_line_and_leaves_nothing(tmp_path, demo_jsonl, tokenizer, phase):
    out, held = tmp_path / "out", tmp_path / "held"
    held.mkdir()
    with open(tmp_path / "stderr", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(HELD_CLI), "prepare", *demo_jsonl, "--tokenizer", str(tokenizer),
                                 "--out", str(out), "--seq-len", "64", "--workers", "2", "--val-fraction", "0.05"],
                                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                                env={**os.environ, "HELD_PHASE": phase, "HELD_DIR": str(held)})
        try:
            wait_until(lambda: (held / phase).exists() or proc.poll() is not None, 120, f"prepare to reach {phase}")
            assert proc.poll() is None, (tmp_path / "stderr").read_text()  # it ended before: a broken setup
            assert procs.signal_child_group(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole group
            (held / "go").touch()  # whatever holds there goes on, as it would have without the hold
            try:
                status = proc.wait(120)  # a bound on a hang, not a timing
            except subprocess.TimeoutExpired:
                pytest.fail(f"SIGINT at {phase} did not end prepare")
        finally:
            if proc.poll() is None:
                procs.signal_child_group(proc.pid, signal.SIGKILL)
                proc.wait()
    wait_until(lambda: not _group_alive(proc.pid), 60, "every process of the command to end")
    said = (tmp_path / "stderr").read_text()
    lines = [line for line in said.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert (status, lines) == (130, ["prepare: interrupted, nothing written"]), said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held", "stderr"]  # no output, no temp dir, no lock
