"""A LoRA run's done check with scratch wiped (daemon/jobs/rundone.py): the remote must hold a copy of the base its
final checkpoint records. Before, with no checkpoint in scratch to say which base, any base's record in
`<remote>/init` passed: a remote `init` of another base (which the sync never replaces: the run's own base push then
failed) made the run "done", nothing launched, its base never pushed. Now the remote step's own trainer_state.json
says which base (read as the fetch reads it, hashed against its manifest)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from minilmd import bounded, names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.jobs.rundone import done_line
from minilmd.fsio import atomic_write_json
from minilmd.trainer.checkpoint import save as ckpt_io
from supervisor_helpers import write_config
from sync_helpers import TINY, weights  # noqa: F401  (fixture)

RECORDED = {"kind": "minimind", "path": "/share/base.pth", "sha256": "a" * 64}
"""The base the run's checkpoints record they were trained from."""


@pytest.fixture(autouse=True)
def remote_looks_wait_long(monkeypatch):
    """The look at the remote waits SHARED_STORAGE_PROBE_S (5 s) at most: on two cores under load a local one could
    take that long."""
    monkeypatch.setattr(bounded, "SHARED_STORAGE_PROBE_S", 600.0)


@pytest.mark.parametrize("copy_of, done", [("a" * 64, True), ("b" * 64, False), (None, False)])
def test_a_wiped_scratch_lora_run_is_done_only_with_its_own_base_on_the_remote(tmp_path, corpus, weights, copy_of,
                                                                               done):
    base = tmp_path / "share" / "base.pth"
    base.parent.mkdir(parents=True)
    base.write_bytes(b"\0" * 300_000)
    cfg = load_config(write_config(tmp_path, corpus, name="lora", init={"from": str(base)},
                                   lora={"rank": 4, "alpha": 8.0}))
    remote = Path(cfg.run.remote)
    state = {"step": 30, "tokens_seen": 30 * 64, "epoch": 0, "config": {"model": dict(TINY)},
             "fingerprints": {"data": "d" * 64, "tokenizer": "t" * 64}, "init": RECORDED}
    ckpt_io.save(remote, 30, weights[0], weights[1], state)  # the final step, synced
    (remote / names.LATEST).write_text("step-00000030\n")
    if copy_of is not None:  # the remote's base copy: its record (the done check reads no more of it)
        (remote / "init").mkdir()
        (remote / "init" / names.INIT_RECORD).write_text(json.dumps({**RECORDED, "sha256": copy_of}))
    cfg.run_dir.mkdir(parents=True)
    body = new_state("lora", cfg.run_dir, str(cfg.source))
    body.update(phase="done", outcome={"exit": 0, "phase": "done", "reason": "the run finished", "ended": "finished"})
    atomic_write_json(cfg.run_dir / names.STATE, body)
    assert not cfg.checkpoint_dir.exists()  # scratch wiped
    assert bool(done_line(cfg, 30, f"remote: {remote / 'step-00000030'}")) is done


@pytest.mark.parametrize("damage", [None, "step removed", "file cut"])
def test_a_finished_run_is_done_only_while_the_step_latest_names_is_whole_on_the_remote(tmp_path, corpus, weights,
                                                                                        damage):
    """LATEST naming the final step is not enough (statusfix10's note): a remote that lost that step's directory,
    or a file of it cut short, kept "done, nothing to do" at every start; now the launch goes on and its last sync
    puts the step back."""
    import shutil

    cfg = load_config(write_config(tmp_path, corpus, name="whole"))
    remote = Path(cfg.run.remote)
    state = {"step": 30, "tokens_seen": 30 * 64, "epoch": 0, "config": {"model": dict(TINY)},
             "fingerprints": {"data": "d" * 64, "tokenizer": "t" * 64}}
    final = ckpt_io.save(remote, 30, weights[0], weights[1], state)
    (remote / names.LATEST).write_text("step-00000030\n")
    if damage == "step removed":
        shutil.rmtree(final)
    elif damage == "file cut":
        model = final / names.MODEL_FILE
        model.write_bytes(model.read_bytes()[:100])
    cfg.run_dir.mkdir(parents=True)
    body = new_state("whole", cfg.run_dir, str(cfg.source))
    body.update(phase="done", outcome={"exit": 0, "phase": "done", "reason": "the run finished", "ended": "finished"})
    atomic_write_json(cfg.run_dir / names.STATE, body)
    assert bool(done_line(cfg, 30, f"remote: {final}")) is (damage is None)
