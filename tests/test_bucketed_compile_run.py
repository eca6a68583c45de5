"""Bucketed SFT compiled under the real supervisor: `minilmd run` of a real trainer (torch.compile, its inductor
backend, on CPU) whose compile lasts longer than restart.hang_timeout, on a chat corpus whose micro-batches come in
several width classes. Every compile runs under the trainer's "compiling" heartbeat (restart.compile_timeout), the
input width is dynamic (trainer/loop/warmup.py): one attempt trains to the end, never killed as hung, and dynamo's
counters (tests/dynamo_counting_trainer.py prints them as the trainer exits) count one graph for every width.

Without the allowance for a later width (the width static, only the first step under "compiling": the tree before
the width classes), the recompile at the second width outlasts hang_timeout and the attempt is killed as hung.
The run's own compile_s (metrics.jsonl) must exceed hang_timeout, so that the test cannot pass with a compile too
short to matter.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from chat_synthetic import synthetic_chat_prepared
from dynamo_counting_trainer import COUNTERS_LINE
from minilmd.config import load_config
from minilmd.daemon.child.process import TRAINER_CMD_ENV
from minilmd.names import ATTEMPT_LOGS, METRICS
from supervisor_helpers import events, run_supervisor, state, write_config

HANG_TIMEOUT_S = 2.0
STEPS = 6
MICRO_BATCH = 4
COUNTING_TRAINER = Path(__file__).with_name("dynamo_counting_trainer.py")


def run_config(tmp: Path, chat: tuple[Path, int], name: str, compile: bool) -> Path:
    return write_config(tmp, chat, name=name, remote=False, data={"mode": "bucketed"},
                        train={"seq_len": 128, "micro_batch_size": MICRO_BATCH, "grad_accum": 1, "max_steps": STEPS,
                               "checkpoint_every": 100, "log_every": 1, "compile": compile},
                        restart={"hang_timeout": f"{HANG_TIMEOUT_S:g}s", "compile_timeout": "10m",
                                 "max_restarts": 0})


def widths_of_the_run(tmp: Path, chat: tuple[Path, int]) -> tuple[int, list[int]]:
    """(the widest width, the width of each step) of the run, from the sampler of a trainer with the same config
    built in this process (eager, in a run directory of its own)."""
    from minilmd.trainer.loop.train import Dist, Trainer

    t = Trainer(load_config(run_config(tmp, chat, "widths", compile=False)), Dist(0, 1, 0, torch.device("cpu")))
    return t.sampler.widest(), [t.sampler.batch(s, t.global_batch, micro=0, micro_batch_size=MICRO_BATCH,
                                                first_row=t.first_row(s)).input_ids.shape[1]
                                for s in range(t.total_steps)]


def steps_with_a_new_width(widest: int, widths: list[int]) -> set[int]:
    """The steps (as metrics count them: step s + 1) that bring a width the trainer has not run (the warm-up runs
    the widest first): each may compile, so each must run under a "compiling" heartbeat."""
    seen, new = {widest}, set()
    for s, width in enumerate(widths):
        if width not in seen:
            seen.add(width)
            new.add(s + 1)
    return new


def dynamo_counters(log: Path) -> dict:
    (line,) = [x for x in log.read_text().splitlines() if x.startswith(COUNTERS_LINE)]
    return json.loads(line[len(COUNTERS_LINE):])


@pytest.mark.slow  # a cold inductor compile on CPU
def test_a_bucketed_compile_longer_than_hang_timeout_is_one_attempt_and_one_graph(tmp_path, corpus):
    prepared, vocab = corpus
    chat = synthetic_chat_prepared(tmp_path / "chat", prepared / "tokenizer.json", vocab, n=96, mean_len=40.0,
                                   max_len=128), vocab
    config = run_config(tmp_path, chat, "compiled", compile=True)
    cfg = load_config(config)
    code = run_supervisor(config, tmp_path, timeout=900, fake=False,
                          **{TRAINER_CMD_ENV: f"{sys.executable} {COUNTING_TRAINER}"})
    logs = sorted((cfg.run_dir / ATTEMPT_LOGS).glob("attempt-*.log"))
    tail = logs[-1].read_text()[-3000:] if logs else (tmp_path / "supervisor.out").read_text()[-3000:]
    assert [e for e in events(cfg.run_dir) if e["event"] == "hang"] == [], tail
    assert code == 0, tail
    assert len(logs) == 1 and [e["cause"] for e in events(cfg.run_dir) if e["event"] == "child_exit"] == ["done"]
    st = state(cfg.run_dir)
    assert st["phase"] == "done" and st["restarts"] == [] and st["progress"]["step"] == STEPS
    train = [m for m in map(json.loads, (cfg.run_dir / METRICS).read_text().splitlines()) if m["kind"] == "train"]
    assert [m["step"] for m in train] == list(range(1, STEPS + 1))
    compile_s = train[0]["compile_s"]  # the warm-up's compile and step 1's, both under "compiling" heartbeats
    assert compile_s > HANG_TIMEOUT_S, f"the compile took {compile_s}s, less than hang_timeout: the test shows nothing"
    widest, widths = widths_of_the_run(tmp_path, chat)
    new = steps_with_a_new_width(widest, widths)
    assert len(set(widths) | {widest}) >= 3 and new, widths  # the run meets several width classes
    # Step 1 brings a new width: the gc.collect() after it (seconds after a compile, on a loaded machine) then runs
    # under "compiling" too, so that the test does not depend on how fast the collector is.
    assert 1 in new, widths
    # compile_s is measured exactly over the steps the trainer announces with a "compiling" heartbeat
    assert {m["step"] for m in train if m["compile_s"] > 0} == new, (widths, train)
    graphs = dynamo_counters(logs[0])["stats"]["unique_graphs"]
    assert graphs == 1, f"{graphs} graphs for widths {widths}"  # the width is dynamic: one graph serves them all
