"""DDP: a 2-rank gloo run under torchrun trains on the same global batch as a 1-rank run and matches its losses
and weights within float tolerance; rank 0 alone writes metrics and checkpoints; at the end every rank has left
its process group: no gloo thread is left to race the interpreter's exit (trainer/loop/distributed.py `release`)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from in_process import train_in_process
from minilmd.protocol import EXIT_DONE
from trainer_corpus import child_env, read_metrics, run_paths, write_config

COUNT_GLOO_THREADS_AT_EXIT = """
import atexit, os, pathlib, sys
def count():  # the threads gloo names, still running once the trainer has returned and the interpreter exits
    names = [p.read_text().strip() for p in pathlib.Path("/proc/self/task").glob("*/comm")]
    line = f"rank {os.environ['RANK']}: gloo threads at exit: {sum('gloo' in n for n in names)}\\n"
    os.write(1, line.encode())  # one write: the ranks share the pipe, and a print may come in two
atexit.register(count)
from minilmd.cli import main
sys.argv[0] = "minilmd"
main()
"""
"""`python -m minilmd.cli` with an exit hook that counts gloo's threads (the train command itself is unchanged)."""


@pytest.mark.slow
def test_two_gloo_ranks_match_one_rank_on_the_same_global_batch(tmp_path, corpus):
    steps = 6
    # Global batch 8 rows either way: 1 rank x 4 rows x 2 micro-batches, or 2 ranks x 2 rows x 2 micro-batches.
    one = write_config(tmp_path, corpus, name="one", train={"max_steps": steps, "micro_batch_size": 4})
    two = write_config(tmp_path, corpus, name="two", train={"max_steps": steps, "micro_batch_size": 2})
    assert train_in_process(one).returncode == EXIT_DONE
    wrapper = tmp_path / "minilmd_counting_threads.py"
    wrapper.write_text(COUNT_GLOO_THREADS_AT_EXIT)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(wrapper), "train", str(two)], capture_output=True, text=True,
                       timeout=300, env=child_env())
    assert p.returncode == EXIT_DONE, p.stdout[-3000:] + p.stderr[-3000:]
    assert "cpu x 2" in p.stdout
    # DDP's lazy import of torch.distributed.nn once held the group for ever: 3 gloo threads per rank at exit
    assert sorted(re.findall(r"rank \d: gloo threads at exit: \d+", p.stdout)) == [
        "rank 0: gloo threads at exit: 0", "rank 1: gloo threads at exit: 0"], p.stdout[-3000:]

    lines_one = read_metrics(run_paths(one)[0], "train")
    lines_two = read_metrics(run_paths(two)[0], "train")
    assert [m["step"] for m in lines_two] == list(range(1, steps + 1))  # one writer: no duplicated lines
    for a, b in zip(lines_one, lines_two, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-5)
        assert b["tokens_seen"] == a["tokens_seen"]
    assert lines_one[-1]["loss"] < lines_one[0]["loss"], "it must actually train"

    w_one = load_file(run_paths(one)[1] / f"step-{steps:08d}" / "model.safetensors")
    w_two = load_file(run_paths(two)[1] / f"step-{steps:08d}" / "model.safetensors")
    assert w_one.keys() == w_two.keys()
    for k in w_one:
        torch.testing.assert_close(w_two[k], w_one[k], rtol=1e-4, atol=1e-5)
