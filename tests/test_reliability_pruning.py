"""Who deletes checkpoints in scratch, through `minilmd run` (the fake trainer, which follows the real one's rule):
under a supervisor only the supervisor prunes, because only it knows what is synced and what it is copying.

- after each verified sync: the newest train.keep_local valid ones and the synced one stay;
- a checkpoint that a (stalled) sync is copying is never deleted, even when scratch is pruned because the remote
  has been failing for long;
- while the remote fails for long, scratch does not fill up: it is pruned down to train.keep_local;
- without a remote, the supervisor keeps the newest train.keep_local.
"""
from __future__ import annotations

import errno

import pytest

from minilmd import checkpoint, checkpoint_dirs
from minilmd.config import load_config
from reliability_helpers import event_texts
from supervisor_helpers import run_supervisor, start_supervisor, state, wait_for, write_config

pytestmark = pytest.mark.slow  # every test runs a supervised run to its end


def local_steps(cfg) -> list[int]:
    return [checkpoint.step_of(p) for p in checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)]


def test_without_a_remote_the_supervisor_keeps_the_newest_keep_local(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False, train={"max_steps": 60, "checkpoint_every": 5,
                                                                 "keep_local": 2})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, timeout=120) == 0
    assert local_steps(cfg) == [55, 60]
    assert any("no remote" in m for m in event_texts(cfg.run_dir, "prune"))


def test_a_checkpoint_being_synced_is_never_pruned_and_a_failing_remote_does_not_fill_scratch(tmp_path, corpus,
                                                                                              faultfs):
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(faultfs.root / "remote")},
                          train={"max_steps": 100000, "checkpoint_every": 5, "keep_local": 2},
                          sync={"every": "1s", "keep": 2})
    cfg = load_config(config)
    # a checkpoint every ~0.6 s: a supervisor that a loaded machine leaves 2 s behind still prunes within the bound
    sup = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.12", MINILMD_SYNC_STALLED_AFTER="1",
                           MINILMD_PRUNE_UNSYNCED_AFTER="2")
    try:
        wait_for(lambda: (state(cfg.run_dir).get("remote_checkpoint") or {}).get("step"), 60, "a first sync")
        # after verified syncs: the newest keep_local and the synced one, nothing more
        wait_for(lambda: any("synced step" in m for m in event_texts(cfg.run_dir, "prune")), 60, "a prune")
        # a sync held in the middle of copying its weights
        stall = faultfs.stall("remote/.tmp-step-*/model.safetensors", 600, op="write")
        hit = wait_for(lambda: faultfs.hits("stall", "write"), 60, "a sync to reach the remote")[0]
        # .tmp-step-XXXXXXXX-<host>-<pid>-<ticks>: the step name is its first two parts, whatever the host's name
        copying = "-".join(hit["path"].split("/")[1][len(".tmp-"):].split("-")[:2])
        assert copying.startswith("step-")
        wait_for(lambda: any("no verified sync for" in m for m in event_texts(cfg.run_dir, "prune")), 60,
                 "pruning while the remote is stuck")
        for _ in range(20):  # scratch stays small, and the checkpoint being copied stays
            steps = local_steps(cfg)
            assert (cfg.checkpoint_dir / copying).is_dir(), (copying, steps)
            assert len(steps) <= cfg.train.keep_local + 4, steps  # not growing: a new one every ~0.6 s
            wait_for(lambda: local_steps(cfg) != steps, 60, "a new checkpoint")
        # now failing outright: pruned to keep_local (+ at most the one just written)
        faultfs.add_rule("*", "remote*", "error", errno=errno.EIO)
        faultfs.remove(stall)
        wait_for(lambda: state(cfg.run_dir).get("sync", {}).get("state") == "failed", 60, "the failure")
        for _ in range(10):
            steps = local_steps(cfg)
            assert len(steps) <= cfg.train.keep_local + 4, steps
            wait_for(lambda: local_steps(cfg) != steps, 60, "a new checkpoint")
        faultfs.clear()
        synced = wait_for(lambda: state(cfg.run_dir).get("sync", {}).get("state") == "ok"
                          and state(cfg.run_dir)["remote_checkpoint"]["step"] > checkpoint.step_of(
                              cfg.checkpoint_dir / copying), 60, "a sync after the remote came back")
        assert synced
    finally:
        faultfs.clear()
        if sup.poll() is None:
            sup.terminate()
            sup.wait(60)
    assert checkpoint_dirs.read_latest(faultfs.backing / "remote") is not None
    checkpoint.validate(faultfs.backing / "remote" / checkpoint_dirs.read_latest(faultfs.backing / "remote"))
