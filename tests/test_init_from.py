"""`[init] from`: a fresh run starts at step 0 from a checkpoint's (or a MiniMind .pth's) weights with a fresh
optimizer and records the source's fingerprint; a source of another model config is refused before anything runs
(config validation, so `minilmd run --check` exits 2), naming the fields; a run that has a checkpoint never reads
init.from again (tests/test_sft_run.py deletes the source mid-run)."""
from __future__ import annotations

import hashlib

import pytest
import torch

from minilmd.config import ConfigError, load_config
from minilmd.daemon import preflight
from minilmd.probes import load_checked
from minilmd.trainer.loop.train import Dist, Trainer
from minilmd.trainer.model.export import export_minimind
from trainer_corpus import TINY_MODEL, write_config
from weights_helpers import save_checkpoint, tiny_model

pytestmark = pytest.mark.slow  # a Trainer each: a few seconds


def trainer(config) -> Trainer:
    return Trainer(load_config(config), Dist(0, 1, 0, torch.device("cpu")))


def test_a_fresh_run_starts_from_a_checkpoint_root_or_a_pth(tmp_path, corpus):
    _, vocab = corpus
    source_model = tiny_model(seed=5, vocab_size=vocab)
    ckpt = save_checkpoint(tmp_path / "pretrain" / "checkpoints", source_model, step=3)  # the root gets LATEST
    weights = {k: v.clone() for k, v in source_model.state_dict().items()}

    t = trainer(write_config(tmp_path, corpus, name="from-root", init={"from": str(ckpt.parent)}))
    assert t.step == 0 and t.resumed_from is None and not t.optimizer.state  # fresh optimizer, step 0
    got = t.model.state_dict()
    assert all(torch.equal(got[k], weights[k]) for k in weights)
    manifest_sha = hashlib.sha256((ckpt / "manifest.json").read_bytes()).hexdigest()
    assert t.trainer_state()["init"] == {"from": str(ckpt.parent), "kind": "checkpoint", "path": str(ckpt.resolve()),
                                         "step": 3, "manifest_sha256": manifest_sha, "pointer": "LATEST"}

    pth = export_minimind(ckpt, tmp_path / "full_sft_64.pth")  # MiniMind's format: fp16, lm_head.weight too
    t = trainer(write_config(tmp_path, corpus, name="from-pth", init={"from": str(pth)}))
    got = t.model.state_dict()
    assert all(torch.equal(got[k], weights[k].half().float()) for k in weights)
    assert t.trainer_state()["init"]["sha256"] == hashlib.sha256(pth.read_bytes()).hexdigest()

    # Another model config: refused, every differing field named; for a .pth, from the shapes it holds.
    wider = {**TINY_MODEL, "hidden_size": 2 * TINY_MODEL["hidden_size"]}
    with pytest.raises(ConfigError, match=r"model\.hidden_size: source 64, run 128"):
        preflight.check(write_config(tmp_path, corpus, name="wide", init={"from": str(ckpt)}, model=wider))
    with pytest.raises(ConfigError, match=r"model\.hidden_size: source 64, run 128"):
        trainer(write_config(tmp_path, corpus, name="wide-pth", init={"from": str(pth)}, model=wider))
    with pytest.raises(ConfigError, match="no such file or directory"):
        load_checked(write_config(tmp_path, corpus, name="gone", init={"from": str(tmp_path / "nothing")}))
