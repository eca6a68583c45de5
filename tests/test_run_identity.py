"""A restart whose config names another scratch or run.remote than its run.dir records (daemon/jobs/runidentity.py).

A new-user audit found two edits that lost work in silence. A new run.name (run.dir unchanged) moved the default
scratch: `run --check` said "resumes from step 10 (remote ...)" and the launch fetched the remote's older step, while
the old scratch still held step 20 and stayed in /dev/shm, never mentioned. A new run.remote with scratch emptied:
"starts from step 0: ... this run has never synced to it", a second timeline in the same run.dir, which `status` and
`plot` then mixed with the first. Now both are refused, exit 2, at `--check` and at launch, in words that say what to
do; the unit tests hold the rule, the slow ones real runs through `minilmd run` and the fake trainer.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import names, scratch
from minilmd.config import load_config
from minilmd.daemon.jobs import runidentity
from minilmd.protocol import SUPERVISOR_CONFIG
from reliability_helpers import event_texts
from supervisor_helpers import cli, env_for, events, run_supervisor, state, write_config


def recorded_run(tmp_path: Path, corpus, steps: tuple[int, ...] = (10, 20), remote_step: int | None = 10):
    """A config (scratch and remote of its own) and a run.dir whose state.json records its scratch holding `steps`
    (owner.json naming the run.dir) and `remote_step` synced to its remote; nothing trained."""
    config = write_config(tmp_path, corpus)
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)
    for step in steps:
        (cfg.checkpoint_dir / names.step_name(step)).mkdir(parents=True)
        (cfg.checkpoint_dir / names.step_name(step) / names.MANIFEST).write_text("{}")
    local = {"step": steps[-1], "path": str(cfg.checkpoint_dir / names.step_name(steps[-1]))} if steps else None
    remote = {"step": remote_step, "path": f"{cfg.run.remote}/{names.step_name(remote_step)}"} \
        if remote_step is not None else None
    (cfg.run_dir / names.STATE).write_text(json.dumps({"run": cfg.run.name, "local_checkpoint": local,
                                                       "remote_checkpoint": remote}))
    return config, cfg


def default_scratch_run(tmp_path: Path, corpus, monkeypatch):
    """A config on the default scratch (under tmp_path/shm) and a run.dir whose state.json records step 20 there."""
    (tmp_path / "shm").mkdir()
    monkeypatch.setenv(names.SCRATCH_BASE_ENV, str(tmp_path / "shm"))
    config = write_config(tmp_path, corpus, run={"scratch": ""})
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)
    (cfg.checkpoint_dir / "step-00000020").mkdir(parents=True)
    (cfg.checkpoint_dir / "step-00000020" / names.MANIFEST).write_text("{}")
    (cfg.run_dir / names.STATE).write_text(json.dumps(
        {"run": "s", "local_checkpoint": {"step": 20, "path": str(cfg.checkpoint_dir / "step-00000020")}}))
    return config, cfg


def moved(config: Path, *sets: str):
    return load_config(config, list(sets))


def test_a_new_scratch_with_the_old_one_holding_a_newer_step_is_refused_with_the_ways_on(tmp_path, corpus):
    config, cfg = recorded_run(tmp_path, corpus)
    new = moved(config, f'run.scratch="{tmp_path / "elsewhere"}"')
    said = runidentity.problems(new, 10, fresh=False)
    assert len(said) == 1, said
    assert f"records its scratch at {cfg.scratch_dir}" in said[0] and "holds checkpoint step 20, newer than step 10" \
        in said[0], said
    assert f"Set run.scratch = '{cfg.scratch_dir}' back to resume from step 20" in said[0], said
    assert f"rm -r {cfg.scratch_dir}" in said[0], said
    assert runidentity.problems(new, 10, fresh=True) == said  # --fresh gives up the old remote's timeline only
    assert runidentity.problems(new, 20, fresh=False) == []  # nothing newer there: said as left behind instead
    assert "still holds checkpoint steps 10, 20" in runidentity.left_behind(new)
    assert runidentity.problems(cfg, None, fresh=False) == [] and runidentity.left_behind(cfg) == ""  # its own


def test_a_new_run_name_moving_the_default_scratch_names_the_old_name(tmp_path, corpus, monkeypatch):
    config, cfg = default_scratch_run(tmp_path, corpus, monkeypatch)
    said = runidentity.problems(moved(config, 'run.name="s2"'), None, fresh=False)
    assert len(said) == 1 and "run.name was 's', it is 's2' now" in said[0], said
    assert f"Put run.name = 's' back, or set run.scratch = '{cfg.scratch_dir}' to resume from step 20" in said[0]


def test_a_default_scratch_moved_by_a_new_slurm_job_is_said_left_behind_not_refused(tmp_path, corpus, monkeypatch):
    """In a Slurm job the default scratch is one per job (`<run.name>-slurm<job id>`): a new job on the node where
    the old one left newer unsynced steps resumes from run.remote, as a job on another node would (exit 2 would end
    a job chain left unattended), and is told that the old job's scratch is left behind, named as the job's."""
    monkeypatch.setenv(names.SLURM_JOB_ENV, "101")
    config, cfg = default_scratch_run(tmp_path, corpus, monkeypatch)
    old = cfg.scratch_dir  # the property follows the job's id
    monkeypatch.setenv(names.SLURM_JOB_ENV, "102")
    assert runidentity.problems(load_config(config), None, fresh=False) == []
    note = runidentity.left_behind(load_config(config))
    assert f"{old}, this run's scratch before (the default scratch is {old.parent}/s-slurm102 now)" in note and \
        "still holds checkpoint steps 20" in note and old.name == "s-slurm101", note
    monkeypatch.setenv(names.SLURM_JOB_ENV, "")  # the same move outside Slurm, by run.scratch: refused
    moved_by_hand = moved(config, f'run.scratch="{tmp_path / "elsewhere"}"')
    assert len(runidentity.problems(moved_by_hand, None, fresh=False)) == 1


def test_an_old_scratch_not_this_runs_or_emptied_refuses_nothing(tmp_path, corpus):
    config, cfg = recorded_run(tmp_path, corpus)
    new = moved(config, f'run.scratch="{tmp_path / "elsewhere"}"')
    marker = json.loads((cfg.scratch_dir / names.SCRATCH_OWNER).read_text())
    (cfg.scratch_dir / names.SCRATCH_OWNER).write_text(json.dumps({**marker, "run_dir": "/some/other/run"}))
    assert runidentity.problems(new, None, fresh=False) == []  # another run's: not read as this one's
    shutil.rmtree(cfg.scratch_dir)  # a reboot emptied /dev/shm: nothing left there to lose
    assert runidentity.problems(new, None, fresh=False) == [] and runidentity.left_behind(new) == ""


def test_a_new_remote_with_a_start_older_than_the_records_is_refused_unless_fresh(tmp_path, corpus):
    config, cfg = recorded_run(tmp_path, corpus, steps=(), remote_step=20)
    new_remote = tmp_path / "new-share" / "remote"
    new = moved(config, f'run.remote="{new_remote}"')
    said = runidentity.problems(new, None, fresh=False)
    assert len(said) == 1, said
    assert f"records step 20 synced to {cfg.run.remote}; run.remote is {new_remote} now, and this launch would " \
           f"start from step 0" in said[0], said
    assert f"Put run.remote = '{cfg.run.remote}' back to resume from step 20" in said[0] and "new run.dir" in \
        said[0] and "`minilmd run --fresh`" in said[0], said
    assert runidentity.problems(new, None, fresh=True) == []
    assert runidentity.problems(new, 20, fresh=False) == []  # scratch holds step 20: it goes on, synced there
    assert runidentity.problems(moved(config, 'run.remote=""'), None, fresh=False)  # a remote taken away too
    assert runidentity.problems(cfg, None, fresh=False) == []  # its own remote: remotewait.py waits for it


def test_the_remotes_recorded_step_counts_only_while_the_remote_does_not_answer(tmp_path, corpus):
    """Out of reach, a remote this run synced step 20 to is waited for (remotewait.py): an old scratch holding step
    20 loses nothing. A remote that answers and holds nothing starts the run from step 0: that scratch's step 20
    would be lost."""
    config, cfg = recorded_run(tmp_path, corpus, remote_step=20)
    new = moved(config, f'run.scratch="{tmp_path / "elsewhere"}"')
    assert runidentity.problems(new, None, fresh=False, remote_unknown=True) == []
    assert runidentity.problems(new, None, fresh=True, remote_unknown=True)  # --fresh waits for nothing
    assert "newer than step 0" in runidentity.problems(new, None, fresh=False)[0]


def test_a_state_json_that_cannot_be_read_refuses_nothing(tmp_path, corpus):
    config, cfg = recorded_run(tmp_path, corpus, remote_step=20)
    (cfg.run_dir / names.STATE).write_text("{torn")
    assert runidentity.problems(moved(config, f'run.scratch="{tmp_path / "x"}"', 'run.remote=""'), None, False) == []


# --- real runs ------------------------------------------------------------------------------------------------------

def assert_refused(config: Path, run_dir: Path, *words: str, env: dict | None = None) -> None:
    """`run --check` and the launch both exit 2 with `words`; the launch started nothing (no event)."""
    before = events(run_dir)
    for args in (("run", "--check", str(config)), ("run", str(config))):
        out = cli(*args, timeout=120, **(env or {}))
        text = out.stdout + out.stderr
        assert out.returncode == SUPERVISOR_CONFIG, text
        missing = [w for w in words if w not in text]
        assert not missing, f"missing {missing} in:\n{text}"
    assert events(run_dir) == before


def finished_on_the_default_scratch(tmp_path: Path, corpus):
    """A run `s` on the default scratch (under tmp_path/shm) trained to step 20 by the supervisor: (the environment
    naming that scratch base, its config, its scratch)."""
    shm = {names.SCRATCH_BASE_ENV: str(tmp_path / "shm")}
    (tmp_path / "shm").mkdir()
    config = write_config(tmp_path, corpus, run={"scratch": ""}, train={"max_steps": 20})
    assert run_supervisor(config, tmp_path, **shm) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    return shm, load_config(config), tmp_path / "shm" / f"minilmd-{os.getuid()}" / "s"


@pytest.mark.slow
def test_a_restart_under_a_new_run_name_is_refused_while_the_old_scratch_holds_newer_work(tmp_path, corpus):
    shm, old, old_scratch = finished_on_the_default_scratch(tmp_path, corpus)
    assert (old_scratch / names.CHECKPOINTS / "step-00000020").is_dir()
    remote = Path(old.run.remote)  # step 20 not synced yet: the remote's newest is 10
    shutil.rmtree(remote / "step-00000020")
    if not (remote / "step-00000010").is_dir():  # the sync passed it by for the newer one
        shutil.copytree(old_scratch / names.CHECKPOINTS / "step-00000010", remote / "step-00000010")
    (remote / names.LATEST).write_text("step-00000010\n")
    config = write_config(tmp_path, corpus, run={"scratch": "", "name": "s2"}, train={"max_steps": 30})
    assert_refused(config, old.run_dir, f"records its scratch at {old_scratch}", "run.name was 's', it is 's2' now",
                   "holds checkpoint step 20, newer than step 10", "Put run.name = 's' back", f"rm -r {old_scratch}",
                   env=shm)
    assert state(old.run_dir)["phase"] == "done"
    shutil.rmtree(old_scratch)  # the steps given up explicitly: the run resumes from the remote's step 10
    said = cli("run", "--check", str(config), **shm)
    assert said.returncode == 0 and "resumes from step 10 (remote" in said.stdout, said.stdout + said.stderr


@pytest.mark.slow
def test_a_new_name_whose_old_scratch_holds_nothing_newer_resumes_and_says_the_old_scratch_is_left(tmp_path, corpus):
    shm, old, old_scratch = finished_on_the_default_scratch(tmp_path, corpus)
    config = write_config(tmp_path, corpus, run={"scratch": "", "name": "s2"}, train={"max_steps": 30})
    said = cli("run", "--check", str(config), **shm)
    assert said.returncode == 0, said.stdout + said.stderr
    assert "resumes from step 20 (remote" in said.stdout and \
        f"note: {old_scratch}, this run's scratch before (run.name was 's'" in said.stdout, said.stdout
    assert run_supervisor(config, tmp_path, **shm) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    assert any(str(old_scratch) in m and "nothing resumes from it or removes it" in m
               for m in event_texts(old.run_dir, "adopt")), event_texts(old.run_dir, "adopt")
    assert (old_scratch / names.CHECKPOINTS / "step-00000020").is_dir()  # said, never removed


@pytest.mark.slow
def test_a_restart_with_a_new_remote_and_an_empty_scratch_is_refused_and_fresh_starts_over(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 20})
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    old = load_config(config)
    shutil.rmtree(old.scratch_dir)  # a reboot emptied it
    new = tmp_path / "new-share" / "remote"
    new.parent.mkdir()
    config = write_config(tmp_path, corpus, run={"remote": str(new)}, train={"max_steps": 30})
    assert_refused(config, old.run_dir, f"records step 20 synced to {old.run.remote}; run.remote is {new} now",
                   "would start from step 0", f"Put run.remote = '{old.run.remote}' back", "new run.dir",
                   "`minilmd run --fresh`")
    assert not new.exists()
    said = cli("run", "--check", "--fresh", str(config))
    assert said.returncode == 0 and "starts from step 0" in said.stdout, said.stdout + said.stderr
    out = subprocess.run([sys.executable, "-m", "minilmd.cli", "run", "--fresh", str(config)], capture_output=True,
                         text=True, timeout=120, env=env_for())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (new / "step-00000030").is_dir()
    assert cli("run", "--check", str(config)).returncode == 0  # the new timeline is this run.dir's own now
