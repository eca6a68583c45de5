"""Ctrl-C in a `minilmd bench` says so in one line (found by a new user: `bench packing` interrupted exited 130
without a word, typer's own handler; the other commands say `interrupted`). A real process group gets SIGINT, as
a terminal sends it, while the bench is held at work (tests/held_cli.py); its temporary files are gone after."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import procs
from trainer_corpus import write_config
from waiting import wait_until

HELD_CLI = Path(__file__).with_name("held_cli.py")

pytestmark = pytest.mark.slow  # real commands in subprocesses


def interrupted(tmp_path: Path, held_at: str, args: list[str]) -> tuple[int, str]:
    """(exit status, stderr) of `minilmd ARGS` given SIGINT (its whole group) while held in `held_at`."""
    held, scratch = tmp_path / "held", tmp_path / "scratch"
    held.mkdir()
    scratch.mkdir()
    with open(tmp_path / "stderr", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(HELD_CLI), *args], stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True, env={**os.environ, "HELD_AT": held_at,
                                                             "HELD_DIR": str(held), "TMPDIR": str(scratch)})
        try:
            wait_until(lambda: (held / "reached").exists() or proc.poll() is not None, 300, f"the bench at {held_at}")
            assert proc.poll() is None, (tmp_path / "stderr").read_text()  # it ended before: a broken setup
            assert procs.signal_child_group(proc.pid, signal.SIGINT)
            (held / "go").touch()
            status = proc.wait(300)  # a bound on a hang, not a timing
        finally:
            if proc.poll() is None:
                procs.signal_child_group(proc.pid, signal.SIGKILL)
                proc.wait()
    assert os.listdir(scratch) == []  # its temporary directories removed
    return status, (tmp_path / "stderr").read_text()


def test_bench_packing_interrupted_says_so(tmp_path, corpus):
    config = write_config(tmp_path, corpus)
    status, said = interrupted(tmp_path, "minilmd.trainer.bench.packing:timed_step",
                               ["bench", "packing", "--prepared", str(corpus[0]), "--config", str(config),
                                "--steps", "2"])
    assert status == 130 and "Traceback" not in said, said
    assert said.splitlines()[-1] == "bench packing: interrupted, no figures; its temporary files removed"


def test_bench_prepare_interrupted_while_its_prepare_runs_says_so(tmp_path, demo_jsonl, tokenizer):
    status, said = interrupted(tmp_path, "minilmd.corpus.bench.prepare:_tree_rss",
                               ["bench", "prepare", *demo_jsonl, "--tokenizer", str(tokenizer), "--workers", "1",
                                "--scratch", str(tmp_path / "scratch")])
    assert status == 130 and "Traceback" not in said, said
    assert said.splitlines()[-1] == "bench prepare: interrupted, no figures; its temporary files removed"
