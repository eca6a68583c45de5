"""A run with checkpoints of its own whose config's init.from now names another source (an edit, `--set
init.from=...`) is told so at `run --check` and the launch (minilmd/init_moved.py names_another,
daemon/jobs/resumefrom.py): [init] is read only at a run's first start. Before, `minilmd run cfg/sft.toml --set
init.from=/x/merged.pth` resumed the run's own step without a word and `status`'s lineage still named the old base."""
from __future__ import annotations

from minilmd.batch_stream import stream_record
from minilmd.config import load_config
from minilmd.init_moved import names_another
from supervisor_helpers import write_config

STARTED = {"from": "/x/base.pth", "kind": "minimind", "path": "/x/base.pth", "sha256": "ab", "size": 10}


def test_check_says_an_init_from_edited_on_a_run_with_checkpoints_is_not_applied(tmp_path, corpus, monkeypatch):
    """resumefrom.problems is what `run --check` and the launch (daemon/preflight.py) say the start with; the
    checkpoint it finds (`find`: a real one needs a trained model) records the init it started from."""
    from minilmd.daemon.jobs import resumefrom

    config = write_config(tmp_path, corpus, name="sft", remote=False)
    recorded = stream_record({"step": 60, "config": {}, "init": STARTED})
    monkeypatch.setattr(resumefrom, "find", lambda cfg, root: resumefrom.Start(
        step=60, where="scratch", path=str(tmp_path / "step-00000060"), recorded=recorded))
    for given, said in (("/x/base.pth", False), ("/x/merged.pth", True)):
        lines: list[str] = []
        cfg = load_config(config, [f"init.from={given}", "train.max_steps=100"])
        assert resumefrom.problems(cfg, None, lines) == []
        assert lines[0].startswith("resumes from step 60"), lines
        edited = [line for line in lines if "init.from now names" in line]
        assert edited == ([
            "note: init.from now names /x/merged.pth; this run started from /x/base.pth and resumes its own "
            "checkpoints (step 60): [init] is read only at a run's first start; for a fine-tune of /x/merged.pth "
            "give it a new run.dir (and run.remote)"] if said else []), lines


def test_the_words_name_the_step_taken_and_a_run_that_started_from_nothing(tmp_path, corpus):
    cfg = load_config(write_config(tmp_path, corpus, name="sft", remote=False), ["init.from=/nfs/pt"])
    record = {"from": "/nfs/old", "kind": "checkpoint", "path": "/nfs/old/step-00000900", "step": 900}
    assert names_another(cfg, record, 60).startswith(
        "init.from now names /nfs/pt; this run started from /nfs/old (step 900) and resumes its own checkpoints "
        "(step 60)")
    assert "started from its own random initialization (no init.from)" in names_another(cfg, None, 60)
    assert names_another(cfg, {**record, "from": "/nfs/pt/"}, 60) == ""  # the same source
    assert names_another(cfg, record, None) == ""  # nothing resumed: init.from is read
