"""A DPO run on two "nodes" resumes (found by a reviewer): each node has a scratch of its own and only rank 0 writes
checkpoints, so a rank on the other node has no copy of them. The weights and optimizer travel to it from rank 0
(trainer/loop/multinode.py), but the reference sums (dpo_reference.safetensors) were read from rank 0's checkpoint
path by every rank: on the second node that path holds nothing, its rank died of CheckpointInvalid at every start
and the job could never resume. The reference now travels with the rest of the checkpoint.

Two nodes are two torchrun processes on loopback (tests/multinode_helpers.py); the second runs in a mount namespace of
its own where the run's scratch is an empty directory (as on another server: the same path, another disk).
"""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from minilmd.config import load_config
from minilmd.names import DPO_REFERENCE, FAULT_ENV
from multinode_helpers import free_port, node_command, run_nodes
from trainer_corpus import read_metrics, resumed_step, run_paths, write_config

pytestmark = pytest.mark.slow

VALUES = {"seq_len": 128, "micro_batch_size": 4, "grad_accum": 1, "lr": 1e-3, "warmup_steps": 2, "max_steps": 8,
          "checkpoint_every": 4, "eval_every": 4, "log_every": 1}
"""Global batch 8 pairs over 2 ranks; a checkpoint at step 4, from which the killed job resumes."""

ON_ANOTHER_NODE = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
"""Runs "$@" where the directory $2 shows the contents of $1 (in the caller's own mount namespace)."""


def mount_namespaces_work(tmp_path) -> bool:
    if shutil.which("unshare") is None:
        return False
    (tmp_path / "probe").mkdir()
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", ON_ANOTHER_NODE, "sh",
                           str(tmp_path / "probe"), str(tmp_path / "probe"), "true"], capture_output=True)
    return done.returncode == 0


def test_a_killed_dpo_job_on_two_nodes_resumes_with_the_reference_rank_0_read(tmp_path, small_dpo_corpus):
    if not mount_namespaces_work(tmp_path):
        pytest.skip("needs root and util-linux's unshare (a mount namespace for the second node's scratch)")
    config = write_config(tmp_path, small_dpo_corpus, name="two", data={"val_windows": 64}, train=VALUES)
    standalone = write_config(tmp_path, small_dpo_corpus, name="one", data={"val_windows": 64}, train=VALUES)
    cfg = load_config(config)
    for scratch in (cfg.scratch_dir, tmp_path / "node1-scratch"):
        scratch.mkdir(mode=0o700, parents=True)
    cfg.run_dir.mkdir(parents=True)
    load_config(standalone).run_dir.mkdir(parents=True)

    port = free_port()
    node0 = node_command(config, port, local_addr="127.0.0.1")  # rank 0, at every start: its addresses sort first
    node1 = ["unshare", "-m", "--propagation", "private", "sh", "-c", ON_ANOTHER_NODE, "sh",
             str(tmp_path / "node1-scratch"), str(cfg.scratch_dir), *node_command(config, port, local_addr="localhost")]
    one_node = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "-m", "minilmd.cli", "train", str(standalone)]
    kill = {FAULT_ENV: "sigkill@6"}  # fires on rank 0: both torchruns exit, their restart loops start them again
    codes = run_nodes([(node0, kill), (node1, kill), (one_node, {})], tmp_path / "logs")
    logs = [(tmp_path / "logs" / f"node{i}.log").read_text(errors="replace") for i in range(3)]
    assert codes == [0, 0, 0], "\n".join(log[-3000:] for log in logs)

    assert (cfg.run_dir / "faults-fired").read_text().split() == ["sigkill@6"]
    assert resumed_step(logs[0]) in (0, 4), logs[0][-3000:]  # step 4, unless its write had not ended by step 6
    assert not list((tmp_path / "node1-scratch").rglob("step-*"))  # the second node never held a checkpoint
    assert [m["source"] for m in read_metrics(cfg.run_dir, "dpo_reference")] == ["computed", "checkpoint"]
    final = "step-00000008"
    got, want = cfg.checkpoint_dir / final, run_paths(standalone)[1] / final
    for name in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(got / name), load_file(want / name)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}:{k}: the resumed two-node job differs from the undisturbed one"
    assert (got / DPO_REFERENCE).read_bytes() == (want / DPO_REFERENCE).read_bytes()
