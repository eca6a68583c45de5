"""`minilmd train` on its own takes torch threads by the supervisor's rule (trainer/loop/cpu_threads.py,
minilmd/threads.py) instead of torch's default of every core: the idle cores for a single CPU trainer, 1 for a GPU
trainer or one of several torchrun ranks, a value set in OMP_NUM_THREADS kept; the log says which and why."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from minilmd.trainer.loop import cpu_threads
from trainer_corpus import child_env, train_cmd, write_config


def test_the_rule_for_each_kind_of_trainer():
    assert cpu_threads.choose("cuda", "t", {}) == (1, "a GPU trainer: its host loop is one thread")
    assert cpu_threads.choose("cpu", "t", {"LOCAL_WORLD_SIZE": "2"}) == (1, "one thread per torchrun rank")
    assert cpu_threads.choose("cpu", "t", {"LOCAL_WORLD_SIZE": "x"})[1].startswith("a single CPU trainer")
    assert cpu_threads.choose("cpu", "t", {"OMP_NUM_THREADS": "3"}) == (
        3, "OMP_NUM_THREADS=3 in the environment of t, kept")
    count, why = cpu_threads.choose("cpu", "t", {})
    plain = r"a single CPU trainer: (\d+|none) of \d+ cores idle \(load average [\d.]+\)(, so 1)?"
    assert 1 <= count <= len(os.sched_getaffinity(0)) and re.fullmatch(plain, why)
    assert cpu_threads.choose("cpu", "t", {"OMP_NUM_THREADS": "many"})[1] == \
        "OMP_NUM_THREADS=many is no thread count: torch's own"


@pytest.mark.slow
def test_train_on_its_own_takes_the_idle_cores_not_torchs_every_core(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 1, "checkpoint_every": 1})
    env = {k: v for k, v in child_env().items() if k != "OMP_NUM_THREADS"}
    p = subprocess.run(train_cmd(config), capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    said = re.search(r"minilmd: torch threads (\d+) \(a single CPU trainer: (?:\d+|none) of (\d+) cores idle \(load",
                     p.stdout)
    assert said is not None, p.stdout
    assert int(said[2]) == len(os.sched_getaffinity(0)) and 1 <= int(said[1]) <= int(said[2])

    kept = subprocess.run(train_cmd(config, "train.max_steps=2"), capture_output=True, text=True, timeout=300,
                          env=child_env())  # OMP_NUM_THREADS=1
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "minilmd: torch threads 1 (OMP_NUM_THREADS=1 in the environment of minilmd train, kept)" in kept.stdout
