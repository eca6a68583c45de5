"""`[gpu] count = 2` with train.device = "cpu" trains on one rank (the supervisor launches one trainer on the CPU:
daemon/phases/gpuwait.py nproc). On main nothing said so: `--check` passed with no note and the trainer's start line
said "cpu x 1" alone. Now both say the count is ignored."""
from __future__ import annotations

from minilmd.config import load_config
from minilmd.daemon.host.gpu import cpu_fallback
from supervisor_helpers import write_config


def test_check_notes_that_gpu_count_is_ignored_on_the_cpu(tmp_path, corpus):
    cfg = load_config(write_config(tmp_path, corpus, remote=False, train={"device": "cpu"}, gpu={"count": 2}))
    assert cpu_fallback(cfg) == "gpu.count = 2 is ignored on the CPU: one trainer process trains (1 rank)"
    one = load_config(write_config(tmp_path, corpus, remote=False, train={"device": "cpu"}, gpu={"count": 1}))
    assert cpu_fallback(one) == ""


def test_the_trainers_start_line_says_gpu_count_is_ignored_on_the_cpu(tmp_path, corpus):
    from trainer.loop.resume import start_lines

    cfg = load_config(write_config(tmp_path, corpus, remote=False, train={"device": "cpu"}, gpu={"count": 2}))
    (line,) = start_lines(cfg, 1000, 1000, "cpu x 1", (0, 8), 8, "text", {})
    assert line.startswith("training 1,000 parameters on cpu x 1 (gpu.count = 2 is ignored on the CPU), "), line
    (two_ranks,) = start_lines(cfg, 1000, 1000, "cpu x 2", (0, 8), 8, "text", {})  # a hand torchrun's ranks
    assert "ignored" not in two_ranks
