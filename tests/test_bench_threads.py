"""`minilmd bench packing` times the step a run takes: with the torch threads the supervisor gives the trainer
(minilmd/threads.py), not torch's default of every core, whose OpenMP threads on a busy host wait for cores at every
barrier (an audit at load 10 on 2 cores got packed 241 tok/s, slower than padded, where the run trained at
thousands); torch's own count given back after; and a warning when a mode's step times spread too far."""
from __future__ import annotations

import os

import pytest
import torch

from minilmd.config import load_config
from minilmd.daemon.child import process as childmod
from minilmd.trainer.bench import packing
from trainer_corpus import write_config


@pytest.mark.slow
def test_the_timed_steps_run_with_the_trainers_threads_not_every_core(tmp_path, corpus, monkeypatch):
    busy = (len(os.sched_getaffinity(0)) + 8.0,) * 3  # every core busy: the supervisor's CPU trainer gets 1 thread
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: busy)
    trainer_rule = childmod.trainer_threads(["minilmd", "train"], "", os.environ)
    assert trainer_rule[0] == "1"

    seen = []

    def counting_step(trainer):
        seen.append(torch.get_num_threads())
        return timed_step(trainer)

    timed_step = packing.timed_step
    monkeypatch.setattr(packing, "timed_step", counting_step)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # torch's default on a 2-core host: every core
    try:
        cfg = load_config(write_config(tmp_path, corpus, train={"micro_batch_size": 4, "grad_accum": 1}))
        result = packing.compare(cfg, steps=2, warmup=1)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert seen == [1] * len(packing.MODES) * 3, seen  # the warm-up step and both timed steps of every mode
    assert (result.threads, after) == (1, 2)  # torch's own count given back
    assert [r.steps for r in (result.packed, result.masked, result.padded)] == [2, 2, 2]  # warm-up untimed
    header = packing.report(result, cfg).splitlines()[0]
    assert header.endswith(f"torch threads 1 ({trainer_rule[1]})"), header


def test_a_mode_whose_steps_spread_too_far_is_warned_of():
    steady = packing.ModeResult("packed", (0.10, 0.12, 0.11), 900, 1000)
    jumpy = packing.ModeResult("padded", (0.10, 0.35, 0.12), 600, 1000)
    assert packing.spread_warning((steady, steady)) == []
    [line] = packing.spread_warning((steady, jumpy))
    assert line.startswith("warning: padded steps took 0.100 to 0.350 s (3.5x)"), line
