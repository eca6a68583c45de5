"""Bucketed SFT under DDP: 2 gloo ranks train on the same buckets as 1 rank (the same global batch, the same bucket
size) and match its losses and weights within float tolerance: the loss is the mean over the targets of the whole
global batch, weighted across ranks by their target counts, not a mean of per-rank means."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from in_process import train_in_process
from minilmd.protocol import EXIT_DONE
from trainer_corpus import child_env, read_metrics, run_paths, write_config


@pytest.mark.slow
def test_two_ranks_match_one_rank_on_the_same_buckets(tmp_path, chat_corpus):
    steps = 4
    # Global batch 8 rows in buckets of 2 either way: 1 rank x 4 micro-batches, or 2 ranks x 2 micro-batches.
    common = {"max_steps": steps, "micro_batch_size": 2, "seq_len": 128, "checkpoint_every": 100}
    one = write_config(tmp_path, chat_corpus, name="one", data={"mode": "bucketed"}, train={**common, "grad_accum": 4})
    two = write_config(tmp_path, chat_corpus, name="two", data={"mode": "bucketed"}, train={**common, "grad_accum": 2})
    p = train_in_process(one)
    assert p.returncode == EXIT_DONE, p.stderr
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "-m", "minilmd.cli", "train", str(two)], capture_output=True, text=True,
                       timeout=300, env=child_env())
    assert p.returncode == EXIT_DONE, p.stdout[-3000:] + p.stderr[-3000:]
    assert "cpu x 2" in p.stdout and "bucketed rows" in p.stdout

    lines_one, lines_two = read_metrics(run_paths(one)[0], "train"), read_metrics(run_paths(two)[0], "train")
    assert [m["step"] for m in lines_two] == list(range(1, steps + 1))
    for a, b in zip(lines_one, lines_two, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-5)
        assert b["tokens_seen"] == a["tokens_seen"]
    w_one = load_file(run_paths(one)[1] / f"step-{steps:08d}" / "model.safetensors")
    w_two = load_file(run_paths(two)[1] / f"step-{steps:08d}" / "model.safetensors")
    assert w_one.keys() == w_two.keys()
    for k in w_one:
        torch.testing.assert_close(w_two[k], w_one[k], rtol=1e-4, atol=1e-5)
