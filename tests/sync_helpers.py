"""Helpers for the tests of the sync to a remote and back (daemon/jobs/sync.py, daemon/jobs/remote.py): a tiny
model's weights (the fixture `weights`), checkpoints of it saved at a step, the run's expectation of them, a local
scratch and remote (the fixture `dirs`), a file damaged in place, and a remote whose sizes lag."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save as save_tensors

from minilmd import checkpoint as ck
from minilmd.config import RunConfig
from minilmd.daemon.jobs.remote_local import LocalRemote
from minilmd.names import DPO_REFERENCE, REFERENCE_PASS
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.model.minimind import MiniMindForCausalLM

torch.set_num_threads(1)

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, vocab_size=128,
            intermediate_size=0, max_position_embeddings=64, rope_theta=1e6, rms_norm_eps=1e-6)
DATA, TOK = "d" * 64, "t" * 64
EXPECTED = ck.Expectation(model=dict(TINY), data_fingerprint=DATA, tokenizer_fingerprint=TOK)


@pytest.fixture(scope="module")
def weights():
    torch.manual_seed(0)
    model = MiniMindForCausalLM(TINY)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # no state yet: valid at any step
    return model.state_dict(), opt.state_dict()


def save(root: Path, step: int, weights, data: str = DATA) -> Path:
    cfg = RunConfig().to_dict()
    cfg["model"] = dict(TINY)
    state = {"step": step, "tokens_seen": step * 64, "epoch": 0, "config": cfg,
             "fingerprints": {"data": data, "tokenizer": TOK}}
    return ckpt_io.save(root, step, weights[0], weights[1], state)


PAIRS = 761
"""The pairs of the reference pass save_pass's step 0s stopped in."""


def save_pass(root: Path, weights, done: int | None, notes: dict | None = None) -> Path:
    """Step 0 as the trainer saves it with the reference pass `done` pairs on (None: the sums complete)."""
    sums = {"train": np.full(4, -1.5, dtype=np.float32), "val": np.full(2, -2.5, dtype=np.float32)}
    if done is not None:
        sums["pass"] = np.array([done, 1], dtype=np.int64)
    if notes is None:
        notes = {} if done is None else {REFERENCE_PASS: [done, PAIRS]}
    state = json.loads(json.dumps(ck.validate(save(root / "proto", 0, weights))))  # a valid trainer_state
    return ckpt_io.save(root, 0, weights[0], weights[1], state, extra={DPO_REFERENCE: save_tensors(sums)},
                        notes=notes)


def corrupt(path: Path) -> None:
    """Flip bytes in the middle of a file, keeping its size."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def dirs(tmp_path):
    return tmp_path / "shm" / "checkpoints", tmp_path / "nfs" / "run"


class StaleSizes(LocalRemote):
    """A remote whose sizes lag (an NFS client's attribute cache): a file named in `sizes` ("/" between the names
    of its path, as in "step-00000010/trainer_state.json") has the size it says, whatever the file has now."""

    def __init__(self, url: str, sizes: dict[str, int]):
        super().__init__(url)
        self.sizes = sizes

    def size(self, *names: str) -> int | None:
        return self.sizes.get("/".join(names), super().size(*names))


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


KILL_MID_SYNC = textwrap.dedent("""
    import os, signal, sys
    from minilmd.daemon.jobs import remote_local, sync
    real_put, calls = remote_local.LocalRemote.put, []
    def put(self, local, *names):
        calls.append(names)
        if len(calls) == int(sys.argv[3]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_put(self, local, *names)
    remote_local.LocalRemote.put = put
    sync.Syncer(sys.argv[1], sys.argv[2]).sync_newest()
""")
"""A sync SIGKILLed at its Nth put (argv: local, remote, N): what a crash half-way through a copy leaves."""

