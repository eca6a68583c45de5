"""A finished stage whose init.from run has trained on since the step it started from is told so beside "run is
done" (minilmd/init_moved.py, daemon/jobs/resumefrom.py): before (user report 9, finding 5), re-running a pipeline
after extending pretraining 900 -> 1000 steps said only that the SFT stage was done, a fine-tune of step 900."""
from __future__ import annotations

import time

from minilmd import names
from minilmd.batch_stream import INIT_USED, stream_record
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.fsio import atomic_write_json
from minilmd.init_moved import moved_on
from supervisor_helpers import write_config


def predecessor_at(tmp_path, corpus, step: int, phase: str = "done"):
    """A run "pt" whose state.json records `step` (finished, or training again): its config."""
    config = write_config(tmp_path, corpus, name="pt")
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    body = new_state("pt", cfg.run_dir, str(config))
    body.update(phase=phase, progress={"step": step})
    if phase == "done":
        body.update(outcome={"exit": 0, "phase": "done", "time": time.time(), "reason": "the run finished"})
    atomic_write_json(cfg.run_dir / names.STATE, body)
    return config


def test_a_done_stage_whose_base_trained_on_is_told_so(tmp_path, corpus):
    pt = predecessor_at(tmp_path, corpus, 1_000, phase="training")
    sft = load_config(write_config(tmp_path, corpus, name="sft", init={"from": str(pt)}))
    record = {"from": str(pt), "kind": "checkpoint", "path": "/nfs/pt/step-00000900", "step": 900}
    said = moved_on(sft, record)
    assert said.startswith("init.from: the run pt has trained beyond step 900, the one this run started from: it is "
                           "at step 1,000 now (training); this run stays a fine-tune of step "
                           "900: for a fine-tune of the new model, give this stage a new run.dir"), said
    finished = predecessor_at(tmp_path, corpus, 1_000)
    assert "at step 1,000 now and has finished;" in moved_on(sft, {**record, "from": str(finished)})


def test_nothing_is_said_when_the_base_is_where_it_was_or_not_a_run(tmp_path, corpus):
    pt = predecessor_at(tmp_path, corpus, 900)
    sft = load_config(write_config(tmp_path, corpus, name="sft", init={"from": str(pt)}))
    assert moved_on(sft, {"kind": "checkpoint", "step": 900}) == ""
    assert moved_on(sft, None) == "" and moved_on(sft, {"kind": "minimind", "sha256": "x"}) == ""
    root = load_config(write_config(tmp_path, corpus, name="lora", init={"from": str(tmp_path / "ckpts")}))
    assert moved_on(root, {"kind": "checkpoint", "step": 1}) == ""  # a checkpoint root, not a run: not followed


def test_a_checkpoints_record_carries_what_init_from_was():
    init = {"kind": "checkpoint", "path": "/nfs/pt/step-00000900", "step": 900}
    assert stream_record({"step": 5, "config": {}, "init": init})[INIT_USED] == init
