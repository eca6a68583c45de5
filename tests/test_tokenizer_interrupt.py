"""Ctrl-C during `minilmd tokenizer train` (found by a new user: SIGINT at 8 s was ignored until training ended at
46 s, then exit 130 without a word). The tokenizers library reads the texts in a thread of its own and trains with
the GIL released, where Python's handler never runs; the command now trains in a process of its own and its own
process, waiting on a pipe, ends it at once: exit 130, `interrupted, nothing written`, no process left behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from held_interrupt import group_alive
from minilmd import procs
from waiting import wait_until

ENDLESS_CLI = Path(__file__).with_name("endless_texts_cli.py")

pytestmark = pytest.mark.slow  # a real command in a subprocess


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_ends_tokenizer_training_at_once_with_nothing_written(tmp_path, sig):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"line {i}: 一段文字 and some words {i * 7}"}) + "\n"
                              for i in range(300)), encoding="utf-8")
    out, started = tmp_path / "out" / "tokenizer.json", tmp_path / "started"
    log = open(tmp_path / "stderr", "wb")
    proc = subprocess.Popen([sys.executable, str(ENDLESS_CLI), "tokenizer", "train", str(corpus), "--out", str(out),
                             "--vocab-size", "300"], stdout=subprocess.DEVNULL, stderr=log,
                            env={**os.environ, "ENDLESS_TEXTS_STARTED": str(started)}, start_new_session=True)
    try:
        wait_until(started.exists, 120, "the training to read past the real texts")
        assert procs.signal_child_group(proc.pid, sig)  # SIGINT: a terminal's Ctrl-C reaches the whole group
        try:
            status = proc.wait(60)  # a bound on a hang: before, the training never ended (its input does not)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{sig!r} did not end `tokenizer train` (its training went on)")
    finally:
        if proc.poll() is None:
            procs.signal_child_group(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    said = (tmp_path / "stderr").read_text()
    assert status == 130 and "tokenizer train: interrupted, nothing written" in said, (status, said)
    assert "Traceback" not in said, said
    assert not out.parent.exists() or list(out.parent.iterdir()) == []
    # the training process ended with it (multiprocessing's resource tracker, in the group too, ends by itself
    # once the processes that held its pipe are gone)
    wait_until(lambda: not group_alive(proc.pid), 60, "every process of the command to end")
