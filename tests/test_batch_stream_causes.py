"""Two causes of a batch stream change at a resume that were said wrongly (minilmd/batch_stream.py):

- the supervisor's own retry after a CUDA OOM (a smaller micro-batch, the global batch kept) made `status` say the
  run was not bit-reproducible in the words of a config edit, or said nothing at the relaunch itself (it stages
  nothing); now the event "data_shape" and state.json's shape_changes, which `status` shows, say it was that retry,
  with the micro-batch it had and the one it has now;
- a resume on another number of ranks (world size: every global batch cut into other rank slices) was not compared
  at all; now it is, from the world size a checkpoint records beside its config."""
from __future__ import annotations

import pytest

from minilmd.batch_stream import OOM_RETRY, stream_changes, stream_record
from minilmd.config import RunConfig, load_config
from supervisor_helpers import cli, events, run_supervisor, state, write_config


@pytest.mark.slow  # a real supervisor and the fake trainer: an OOM at step 13 after the save at step 10
def test_an_oom_retry_at_a_resume_is_said_as_the_supervisors_own_with_the_old_and_new_micro_batch(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False, train={"micro_batch_size": 4, "grad_accum": 1})
    run_dir = load_config(config).run_dir
    assert run_supervisor(config, tmp_path, MINILMD_FAULT="oom@13") == 0

    said = ("train.micro_batch_size = 2 (was 4) and train.grad_accum = 2 (was 1) by the supervisor's retry after a "
            "CUDA OOM (the global batch kept)")
    assert state(run_dir)["shape_changes"] == [f"step 10: {said}"]
    shaped = [e for e in events(run_dir) if e["event"] == "data_shape"]
    assert [(e["step"], said in e["message"]) for e in shaped] == [(10, True)], shaped
    shown = cli("status", str(run_dir)).stdout
    assert ("bit-reproducible: no (a resume changed the batch stream, the lr schedule or the update: step 10: "
            f"{said}") in shown, shown


def test_the_oom_retrys_keys_are_said_as_its_own_and_a_config_edit_as_before():
    cfg = RunConfig()
    cfg.override("train.seq_len", 64)
    recorded = {"train": {"seq_len": 32, "micro_batch_size": 32, "grad_accum": 1}}
    changes = stream_changes(cfg, recorded, {"train.micro_batch_size": 16, "train.grad_accum": 2})
    assert changes == ["train.seq_len = 64 (was 32)",
                       f"train.micro_batch_size = 16 (was 32) and train.grad_accum = 2 (was 1) {OOM_RETRY}"]


def test_a_resume_on_another_number_of_ranks_changes_the_batch_stream():
    cfg = RunConfig()
    recorded = stream_record({"config": cfg.to_dict(), "world_size": 2})
    assert stream_changes(cfg, recorded, world_size=2) == []
    said = stream_changes(cfg, recorded, world_size=4)
    assert len(said) == 1 and said[0].startswith("world size = 4 rank(s) (was 2: "), said
    cfg.override("gpu.count", 2)  # the supervisor's launch: its ranks are gpu.count's
    assert stream_changes(cfg, recorded) == []
    cfg.override("gpu.count", 1)
    assert stream_changes(cfg, recorded)[0].startswith("world size = 1 rank(s) (was 2")
    assert stream_changes(cfg, stream_record({"config": cfg.to_dict()})) == []  # recorded none: not compared


def test_staging_compares_the_world_size_with_the_ranks_the_supervisor_launches(tmp_path):
    """A Slurm job of 2 nodes x 2 cards trains on 4 ranks while its config says gpu.count = 2: its own restart
    changes nothing, and says nothing; on 2 ranks it changes the batch stream."""
    import json

    from minilmd import names
    from minilmd.daemon.base.runstate import RunState, new_state
    from minilmd.daemon.jobs.stagingworker import StagingWorker

    cfg = RunConfig()
    cfg.override("run.scratch", str(tmp_path / "scratch"))
    cfg.override("gpu.count", 2)
    step = cfg.checkpoint_dir / "step-00000010"
    step.mkdir(parents=True)
    (step / names.TRAINER_STATE).write_text(json.dumps({"config": cfg.to_dict(), "world_size": 4}))
    emitted: list[tuple] = []
    run_state = RunState(tmp_path / names.STATE, new_state("s", tmp_path, "s.toml"))
    staging = StagingWorker(cfg, None, run_state, lambda *a, **kw: emitted.append((a, kw)), None, None)
    staging.ranks = lambda: 4
    staging.record_shape_change()
    assert run_state.shape_changes == [] and emitted == []
    staging.ranks = lambda: 2
    staging.record_shape_change()
    assert [line.split(" (was")[0] for line in run_state.shape_changes] == ["step 10: world size = 2 rank(s)"]
    assert [a[0] for a, _ in emitted] == ["data_shape"]
