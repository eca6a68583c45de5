"""More than one server without Slurm, on loopback: two "nodes" are two torchrun processes on this machine joined
by torchrun's c10d rendezvous on 127.0.0.1 (`--nnodes 2`), exactly the commands docs/operations.md gives for two
servers. The global batch is the same in every case, and the same as the single-process undisturbed run (8 rows a
step).

- 2 nodes x 2 gloo ranks train as 1 node x 4 ranks, and as one process, within float tolerance;
- 2 nodes x 1 rank train as 1 node x 2 ranks, and as one process, within float tolerance;
- a rank SIGKILLed on one node (MINILMD_FAULT=sigkill@10 fires on rank 0): its torchrun exits, the other node's
  rank fails on its next collective and that torchrun exits too (torchrun's own restarts are off, as under the
  supervisor); each server's restart loop starts its torchrun again, they meet at the rendezvous and resume from
  the last checkpoint (step 8, or 4 if the kill came before step 8's write ended): the job finishes with the
  weights, bit for bit, of the undisturbed 1 node x 2 ranks run. The ranks on the node without rank 0 receive the
  checkpoint from rank 0 (trainer/loop/multinode.py), as they would on a node whose scratch holds none.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minilmd import checkpoint_dirs
from minilmd.config import load_config
from minilmd.names import FAULT_ENV
from multinode_helpers import free_port, node_command, run_nodes

pytestmark = pytest.mark.slow
TWO_RANKS = {"train": {"micro_batch_size": 4, "grad_accum": 1}}
"""BASELINE's global batch of 8 rows over 2 ranks: 4 rows x 1 micro-batch each."""
FOUR_RANKS = {"train": {"micro_batch_size": 2, "grad_accum": 1}}
"""The same global batch over 4 ranks: 2 rows x 1 micro-batch each."""


def one_node_and_two(straight, tmp_path: Path, ranks: dict, nproc: int) -> tuple[Path, Path, list[str]]:
    """The undisturbed run's config (`ranks`: its batch per rank) for one node of 2 x nproc ranks and for two nodes
    of nproc each, their run directories made: (one node's config, two nodes' config, one node's torchrun)."""
    one_node = straight.config_like(tmp_path, "one", **ranks)
    two_nodes = straight.config_like(tmp_path, "two", **ranks)
    for config in (one_node, two_nodes):
        load_config(config).run_dir.mkdir(parents=True)
    standalone = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(2 * nproc),
                  "-m", "minilmd.cli", "train", str(one_node)]
    return one_node, two_nodes, standalone


def final_weights(config: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    newest = checkpoint_dirs.list_checkpoints(load_config(config).checkpoint_dir)[-1]
    return newest, load_file(newest / "model.safetensors")


def test_multinode_on_loopback_matches_one_node_and_a_killed_rank_restarts_from_the_checkpoint(tmp_path, undisturbed):
    straight = undisturbed()
    one_node, two_nodes, standalone = one_node_and_two(straight, tmp_path, TWO_RANKS, nproc=1)
    port = free_port()
    # all three at once: the rendezvous and the restart wait more than they compute
    kill = {FAULT_ENV: "sigkill@10"}
    codes = run_nodes([(node_command(two_nodes, port), kill), (node_command(two_nodes, port), kill), (standalone, {})],
                      tmp_path / "two-logs")
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((tmp_path / "two-logs").iterdir())[:2])
    assert codes == [0, 0, 0], logs[-4000:]
    assert "injecting fault" not in (tmp_path / "two-logs" / "node2.log").read_text()

    run_dir = load_config(two_nodes).run_dir
    assert (run_dir / "faults-fired").read_text().split() == ["sigkill@10"]
    assert "exitcode: -9" in logs.replace(" ", "").replace(":", ": ", 1) or "exitcode:-9" in logs.replace(" ", "")
    assert logs.count("restart 1") == 2 and "restart 2" not in logs, logs[-3000:]  # both servers, once
    # the restart went back to a checkpoint: step 8's save waited for step 4's write; step 8's may not have ended
    assert "at step 8" in logs or "at step 4" in logs, logs[-3000:]

    one_ckpt, one = final_weights(one_node)
    two_ckpt, two = final_weights(two_nodes)
    single = load_file(straight.checkpoint / "model.safetensors")
    assert one_ckpt.name == two_ckpt.name == straight.checkpoint.name == "step-00000016"
    assert one.keys() == two.keys() == single.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5)  # 2 nodes x 1 = 1 node x 2
        torch.testing.assert_close(one[name], single[name], rtol=1e-4, atol=1e-5)  # = one process, same batch
        assert torch.equal(two[name], one[name]), f"{name}: the restarted job's weights differ from the undisturbed"


def test_multinode_two_nodes_of_two_ranks_train_as_one_node_of_four(tmp_path, undisturbed):
    straight = undisturbed()
    one_node, two_nodes, standalone = one_node_and_two(straight, tmp_path, FOUR_RANKS, nproc=2)
    port = free_port()
    codes = run_nodes([(node_command(two_nodes, port, nproc=2), {}), (node_command(two_nodes, port, nproc=2), {}),
                       (standalone, {})], tmp_path / "logs")
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((tmp_path / "logs").iterdir()))
    assert codes == [0, 0, 0], logs[-4000:]
    assert "x 4, packed rows" in logs  # every job trained with 4 ranks (the trainer's start line)
    one_ckpt, one = final_weights(one_node)
    two_ckpt, two = final_weights(two_nodes)
    single = load_file(straight.checkpoint / "model.safetensors")
    assert one_ckpt.name == two_ckpt.name == straight.checkpoint.name == "step-00000016"
    for name in single:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5)  # 2 nodes x 2 = 1 node x 4
        torch.testing.assert_close(one[name], single[name], rtol=1e-4, atol=1e-5)  # = one process, same batch
