"""init.from naming another run (a predecessor, often another user's, in a directory others may rearrange): its
run.toml and its state.json are read in its run directory opened once (minilmd/run_config_copy.py `run_config_of`,
and `predecessor_state` through init_place.reopen: that very directory or none), and the checkpoints the lineage and
the update share follow are read as init.from's own are (init_source.source_state: a file of its directory's owner
or ours). A real second user (nobody) owns the predecessor; a third uid without an account owns what is planted.

Reproduced on the code before: the run directory was looked at by its descriptor, then its run.toml read by path
(load_config) and its state.json in the directory its path led to when read: a link to another run swapped in
between (by whoever can write above it) made this stage wait on that run and start from its checkpoint, or take an
unfinished predecessor for finished (the third uid's finished state.json read as that directory's owner's). The
lineage `status` shows and `run --check`'s update share read a trainer_state.json a third uid planted in the
teammate's checkpoint (no owner checked). The lineage says whose each checkpoint it read is where it is neither
the caller's nor root's (before: a teammate's shown as if the caller's own).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from minilmd import init_source, names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.phases import initwait
from minilmd.daemon.views.run_context import RunContext
from minilmd.fsio import atomic_write_json
from minilmd.init_source import InitSourceError, predecessor_outcome, resolve
from minilmd.plan.update_share import base_rows
from second_user import chown_tree, teammate  # noqa: F401 - teammate: a fixture
from supervisor_helpers import run_whose_step_1_records, write_config

pytestmark = pytest.mark.root

THIRD_UID = 54321
STEP = names.step_name(3)


def _run(tmp: Path, corpus, where: Path, name: str, finished: bool, uid: int) -> Path:
    """A run directory `where/name` of `uid` (run.toml, state.json: finished or training), its checkpoint root
    (LATEST -> step 3, its manifest) in its scratch; returns its run directory."""
    config = write_config(tmp, corpus, name=name, remote=False, run={"dir": str(where / name)})
    cfg = load_config(config)
    cfg.run_dir.mkdir()
    shutil.copyfile(config, cfg.run_dir / names.RUN_CONFIG_COPY)
    body = new_state(name, cfg.run_dir, str(config))
    if finished:
        body.update(phase="done", outcome={"exit": 0, "phase": "done", "time": 1.0, "reason": "finished"})
    else:
        body.update(phase="training", progress={"step": 3}, updated=time.time())
    atomic_write_json(cfg.run_dir / names.STATE, body)
    (cfg.checkpoint_dir / STEP).mkdir(parents=True)
    (cfg.checkpoint_dir / STEP / names.MANIFEST).write_text(json.dumps({"step": 3, "files": {}}))
    (cfg.checkpoint_dir / names.LATEST).write_text(STEP)
    chown_tree(cfg.run_dir, uid, uid)
    return cfg.run_dir


def _swap_for_link(run_dir: Path, to: Path) -> None:
    """What whoever can write above `run_dir` does: moves it aside, puts a link to `to` in its place."""
    run_dir.rename(run_dir.with_name(run_dir.name + ".was"))
    run_dir.symlink_to(to)


def test_a_run_directory_swapped_while_its_run_toml_is_read_is_not_taken_for_the_other_run(
        tmp_path, corpus, teammate, monkeypatch):
    """Her unfinished run `pre` is swapped for a link to her finished run `other` right after init.from's
    directory was opened: this stage still names `pre` and waits, never starts from `other`'s checkpoint."""
    (uid, _), where = teammate
    pre = _run(tmp_path, corpus, where, "pre", finished=False, uid=uid)
    other = _run(tmp_path, corpus, where, "other", finished=True, uid=uid)
    opened = init_source.open_named
    swaps = []

    def opened_then_swapped(path):
        found = opened(path)
        if not swaps:
            swaps.append(path)
            _swap_for_link(pre, other)
        return found

    monkeypatch.setattr(init_source, "open_named", opened_then_swapped)
    with pytest.raises(InitSourceError, match="names the run pre, which has not finished .*not the directory "
                                              "resolved a moment ago"):
        resolve(str(pre))
    assert swaps == [Path(pre)]


@pytest.mark.parametrize("reader", ["resolve", "the waiting stage's poll"])
def test_a_run_directory_swapped_before_its_state_json_is_read_is_not_taken_for_finished(
        tmp_path, corpus, teammate, monkeypatch, reader):
    """Her unfinished run, its run.toml read, is swapped for a link to a third uid's finished run before its
    state.json is read: still waiting (never finished by a state.json of another directory's owner)."""
    (uid, _), where = teammate
    pre = _run(tmp_path, corpus, where, "pre", finished=False, uid=uid)
    theirs = _run(tmp_path, corpus, where, "theirs", finished=True, uid=THIRD_UID)
    module = init_source if reader == "resolve" else initwait
    found = module.predecessor

    def found_then_swapped(spec):
        pred = found(spec)
        _swap_for_link(pre, theirs)
        return pred

    monkeypatch.setattr(module, "predecessor", found_then_swapped)
    if reader == "resolve":
        with pytest.raises(InitSourceError, match="names the run pre, which has not finished"):
            resolve(str(pre))
        return
    stage = load_config(write_config(tmp_path, corpus, name="next", init={"from": str(pre)}))
    poll = initwait.poll_predecessor(stage)
    assert poll.pred is not None and poll.pred.name == "pre", poll
    assert poll.report is not None and poll.report.outcome == "waiting", poll.report
    assert "not the directory resolved a moment ago" in poll.report.why, poll.report


def test_the_predecessor_read_unswapped_is_read_whole(tmp_path, corpus, teammate):
    """The same runs, nothing swapped: her run.toml and state.json are read as hers (what the tests above take
    away is the swap alone)."""
    (uid, _), where = teammate
    pre = _run(tmp_path, corpus, where, "pre", finished=False, uid=uid)
    other = _run(tmp_path, corpus, where, "other", finished=True, uid=uid)
    assert predecessor_outcome(init_source.predecessor(str(pre))) == ("waiting", "run pre is training at step 3")
    assert predecessor_outcome(init_source.predecessor(str(other))) == ("done", "run other finished at step None")
    hers = load_config(other / names.RUN_CONFIG_COPY, untrusted=True, owners=(uid,))  # her copy, read as hers
    assert resolve(str(other)).path == hers.checkpoint_dir / STEP


def _her_checkpoint(where: Path, uid: int, planted_by: int) -> Path:
    """Her checkpoint root (LATEST -> step 5) whose trainer_state.json, owned by `planted_by`, records 80 rows and
    an init.from of its own (/planted.pth)."""
    root = where / "hers"
    step = root / names.step_name(5)
    step.mkdir(parents=True)
    (step / names.MANIFEST).write_text(json.dumps({"step": 5, "files": {}}))
    init = {"kind": "minimind", "path": "/planted.pth", "sha256": "cd" * 32}
    (step / names.TRAINER_STATE).write_text(json.dumps({"step": 5, "rows_seen": 80, "init": init}))
    (root / names.LATEST).write_text(step.name)
    chown_tree(root, uid, uid)
    os.chown(step / names.TRAINER_STATE, planted_by, planted_by)
    return step


@pytest.mark.parametrize("planted_by", ["her", "a third uid"])
def test_the_lineage_reads_her_checkpoints_trainer_state_not_one_a_third_uid_planted(
        tmp_path, corpus, teammate, planted_by):
    (uid, _), where = teammate
    step = _her_checkpoint(where, uid, uid if planted_by == "her" else THIRD_UID)
    init = {"kind": "checkpoint", "path": str(step), "step": 5, "manifest_sha256": "ab" * 32}
    run_dir = run_whose_step_1_records(tmp_path, corpus, init, name="mine", remote=False)[1].run_dir
    hers = f"{step} (step 5, manifest sha256 abababababab, belongs to user nobody (uid {uid}))"  # whose: said
    chain = [hers, "/planted.pth (a .pth: weights alone, no step nor source recorded; sha256 cdcdcdcdcdcd)"] \
        if planted_by == "her" else [hers]
    assert initwait.lineage(load_config(run_dir / names.RUN_CONFIG_COPY).checkpoint_dir) == chain
    assert RunContext(run_dir).lineage_lines() == [f"  lineage: {' <- '.join(chain)}"]


@pytest.mark.parametrize("planted_by", ["her", "a third uid"])
def test_the_update_share_reads_her_trainer_state_not_one_a_third_uid_planted(teammate, planted_by):
    (uid, _), where = teammate
    step = _her_checkpoint(where, uid, uid if planted_by == "her" else THIRD_UID)
    cfg = SimpleNamespace(init=SimpleNamespace(from_=str(step.parent), checkpoint="last"))
    found = base_rows(cfg)  # type: ignore[arg-type]
    assert (found is not None and found[:2] == (step, 80)) if planted_by == "her" else found is None, found
