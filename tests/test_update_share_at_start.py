"""The update share (minilmd/plan/update_share.py) reaches the run's log at every first start from a finished base,
not only when the stage waited for it (daemon/phases/initwait.py at_start): systemd and sbatch never run
`run --check`, the one other place that says it. A resume from the run's own checkpoint says it no more."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import load_config
from supervisor_helpers import cli, events, run_supervisor, write_config

pytestmark = pytest.mark.slow  # two fake runs in a row, and a resume


def _stage(tmp_path, corpus, base: Path, steps: int) -> Path:
    return write_config(tmp_path, corpus, name="sft", init={"from": str(base)},
                        train={"max_steps": steps, "checkpoint_every": 2})


def _shares_said(run_dir: Path) -> list[str]:
    return [e["message"] for e in events(run_dir) if e.get("event") == "update_share"]


def _a_stage_run_after_its_base(tmp_path, corpus) -> tuple[Path, Path, list[str]]:
    """(the base's config, the stage's, what the stage's first start logged as its update share): a base of 8
    steps run to its end, then a stage of 4 steps from it run to its end; logs under tmp_path/b, s (s2 for a
    resume)."""
    for log in ("b", "s", "s2"):
        (tmp_path / log).mkdir()
    base = write_config(tmp_path, corpus, name="pretrain", train={"max_steps": 8, "checkpoint_every": 4})
    assert run_supervisor(base, tmp_path / "b") == 0
    stage = _stage(tmp_path, corpus, base, 4)
    assert run_supervisor(stage, tmp_path / "s") == 0
    said = _shares_said(load_config(stage).run_dir)
    assert len(said) == 1, said
    return base, stage, said


def test_a_stage_started_after_its_base_finished_logs_the_update_share_once(tmp_path, corpus):
    base, stage, said = _a_stage_run_after_its_base(tmp_path, corpus)
    assert said[0].startswith("update share: this run trains"), said  # 4 steps on 8: 50 %, of a base from scratch
    assert "its base was trained from scratch" in said[0], said
    assert "rows its base" not in said[0], said  # in documents: the base recorded its corpus, its staged copy gone
    assert "pretrain" in said[0], said
    assert _stage(tmp_path, corpus, base, 6) == stage
    assert run_supervisor(stage, tmp_path / "s2") == 0  # the budget raised: it resumes from its own step 4
    assert _shares_said(load_config(stage).run_dir) == said


def test_a_resume_on_a_new_machine_that_lost_state_json_says_the_share_no_more(tmp_path, corpus):
    """A new machine: the same run.dir (a shared home) whose state.json is gone, an empty scratch, the run's own
    checkpoints on run.remote. Before, the start took the lost state.json for a first start: the share was logged
    again (and a predecessor training again would have been waited for). Now the launch's look at run.remote, which
    a new machine sees, says the run resumes."""
    base, stage, said = _a_stage_run_after_its_base(tmp_path, corpus)
    cfg = load_config(stage)
    (cfg.run_dir / names.STATE).unlink()  # the new machine has none, nor the old scratch
    shutil.rmtree(cfg.scratch_dir)
    assert _stage(tmp_path, corpus, base, 6) == stage
    base_state = load_config(base).run_dir / names.STATE
    base_state.rename(base_state.with_name("aside"))  # the base not finished to look at: a first start would wait
    checked = cli("run", "--check", str(stage))
    assert checked.returncode == 0 and "resumes from step 4 (remote:" in checked.stdout, checked.stdout
    assert "waits: init.from" not in checked.stdout, checked.stdout  # the launch does not wait: it resumes
    base_state.with_name("aside").rename(base_state)
    assert run_supervisor(stage, tmp_path / "s2") == 0  # the budget raised: it resumes from the remote's step 4
    fetched = [e["message"] for e in events(cfg.run_dir) if e.get("event") == "fetch"]
    assert any("fetched" in m and "step-00000004" in m for m in fetched), fetched
    assert _shares_said(cfg.run_dir) == said
