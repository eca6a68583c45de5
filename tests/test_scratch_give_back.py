"""A finished run gives its scratch back: scratch is RAM (/dev/shm) on a shared server, and a finished stage left
its staged corpus and checkpoints there for good (issue: every stage finishes unattended).

- `minilmd run` to the end with a remote: scratch is removed once the last checkpoint is verified there, and the
  run's events say how much was freed; the remote keeps the checkpoint.
- `run.keep_scratch = true`, or no `run.remote` (scratch holds the only copy): scratch stays, and the events say why.
- `scratch_end.give_back` never removes a directory that is not marked for this run.
- A run stopped before its first checkpoint removes its scratch (issue 39: it kept it); one with anything under
  checkpoints/ keeps it, as does `run.keep_scratch`.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from minilmd import checkpoint, scratch, scratch_end
from minilmd.config import RunSection, load_config
from minilmd.protocol import SUPERVISOR_GAVE_UP
from supervisor_helpers import (
    cli,
    events,
    run_supervisor,
    start_supervisor,
    state,
    wait_for,
    wait_or_kill,
    write_config,
)


def _claimed(tmp_path: Path, name: str = "s") -> tuple[Path, Path]:
    scratch_dir, run_dir = tmp_path / name / "scratch", tmp_path / name / "run"
    run_dir.mkdir(parents=True)
    scratch.claim(scratch_dir, run_dir, name, is_default=False)
    (scratch_dir / "corpus").mkdir()
    (scratch_dir / "corpus" / "tokens.bin").write_bytes(b"\0" * 300_000)
    return scratch_dir, run_dir


def test_give_back_removes_a_marked_scratch_and_says_what_it_freed(tmp_path):
    scratch_dir, run_dir = _claimed(tmp_path)
    said = scratch_end.give_back(scratch_dir, run_dir, RunSection(remote="/nfs/x"))
    assert not scratch_dir.exists()
    assert said.startswith(f"removed {scratch_dir}: ") and said.endswith(" MB freed")
    assert float(said.split(": ")[1].split(" MB")[0]) >= 0.3  # the 300 kB file at least


@pytest.mark.parametrize("run, kept_because", [
    (RunSection(remote="/nfs/x", keep_scratch=True), "run.keep_scratch = true"),
    (RunSection(remote=""), "the only copy of the checkpoints (no run.remote)"),
])
def test_give_back_keeps_scratch_when_asked_or_when_it_is_the_only_copy(tmp_path, run, kept_because):
    scratch_dir, run_dir = _claimed(tmp_path)
    said = scratch_end.give_back(scratch_dir, run_dir, run)
    assert (scratch_dir / "corpus" / "tokens.bin").is_file()
    assert said.startswith(f"kept {scratch_dir}") and kept_because in said


def test_give_back_leaves_a_scratch_of_another_run_or_without_marker(tmp_path):
    scratch_dir, _ = _claimed(tmp_path)
    said = scratch_end.give_back(scratch_dir, tmp_path / "another-run", RunSection(remote="/nfs/x"))
    assert (scratch_dir / "corpus" / "tokens.bin").is_file() and "left" in said and "another-run" in said
    unmarked = tmp_path / "unmarked"
    (unmarked / "notes").mkdir(parents=True)
    said = scratch_end.give_back(unmarked, tmp_path / "s" / "run", RunSection(remote="/nfs/x"))
    assert (unmarked / "notes").is_dir() and "left" in said


@pytest.mark.slow
@pytest.mark.parametrize("keep", [False, True])
def test_a_finished_run_removes_its_scratch_after_the_last_sync_unless_kept(tmp_path, corpus, keep):
    config = write_config(tmp_path, corpus, run={"keep_scratch": keep})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path) == 0
    said = [e["message"] for e in events(cfg.run_dir) if e.get("event") == "scratch"]
    assert len(said) == 1, events(cfg.run_dir)[-5:]
    assert cfg.scratch_dir.exists() == keep
    assert said[0].startswith(("kept " if keep else "removed ") + str(cfg.scratch_dir))
    remote = Path(cfg.run.remote)
    assert checkpoint.read_latest(remote) == "step-00000030"
    checkpoint.validate(remote / "step-00000030")


def test_a_scratch_without_a_checkpoint_goes_back_one_with_anything_under_checkpoints_stays(tmp_path):
    scratch_dir, run_dir = _claimed(tmp_path)
    (scratch_dir / "checkpoints" / "quarantine").mkdir(parents=True)
    assert scratch_end.give_back_unsaved(scratch_dir, run_dir, RunSection(remote="/nfs/x")) is None
    assert (scratch_dir / "corpus" / "tokens.bin").is_file()
    (scratch_dir / "checkpoints" / "quarantine").rmdir()
    assert scratch_end.give_back_unsaved(scratch_dir, run_dir, RunSection(keep_scratch=True)) is None
    said = scratch_end.give_back_unsaved(scratch_dir, tmp_path / "another-run", RunSection())
    assert (scratch_dir / "corpus").is_dir() and said is not None and "another-run" in said
    said = scratch_end.give_back_unsaved(scratch_dir, run_dir, RunSection())
    assert not scratch_dir.exists() and said is not None and said.startswith(f"removed {scratch_dir}: "), said


@pytest.mark.slow
def test_a_run_stopped_before_it_trained_removes_its_scratch(tmp_path, corpus):
    """Issue 39: stopped while it waited for its predecessor (init.from a run not started), the run kept the
    scratch it had claimed at launch."""
    before = write_config(tmp_path, corpus, name="before")
    config = write_config(tmp_path, corpus, name="after", init={"from": str(before)}, run={"keep_scratch": False})
    cfg = load_config(config)
    proc = start_supervisor(config, tmp_path / "after.out")
    try:
        wait_for(lambda: state(cfg.run_dir).get("phase") == "waiting_init", timeout=120)
        assert (cfg.scratch_dir / "owner.json").is_file()
        stopped = cli("stop", str(cfg.run_dir), timeout=120)
        assert stopped.returncode == 0, stopped
    finally:
        assert wait_or_kill(proc) == 0
    assert not cfg.scratch_dir.exists()
    said = [e["message"] for e in events(cfg.run_dir) if e.get("event") == "scratch"]
    assert len(said) == 1 and said[0].startswith(f"removed {cfg.scratch_dir}: "), said


@pytest.mark.parametrize("where", ["the run directory", "inside it", "holding it"])
def test_a_scratch_overlapping_the_run_directory_is_refused_and_never_given_back(tmp_path, where):
    """A review found `run.scratch = run.dir` accepted by `--check`, and a stop then deleting the whole run
    directory (state, events, logs) through the give-back's rmtree."""
    run_dir = tmp_path / "run"
    scratch_dir = {"the run directory": run_dir, "inside it": run_dir / "scratch", "holding it": tmp_path}[where]
    run_dir.mkdir()
    (run_dir / "state.json").write_text("{}")
    scratch_dir.mkdir(exist_ok=True)
    assert "overlap" in " ".join(scratch.problems(scratch_dir, run_dir, is_default=False))
    with pytest.raises(scratch.ScratchRefused):
        scratch.claim(scratch_dir, run_dir, "r", is_default=False)
    assert "overlap" in (scratch.remove_own(scratch_dir, run_dir) or "")
    assert (run_dir / "state.json").is_file()


@pytest.mark.slow
def test_a_finished_trainer_with_no_checkpoint_in_scratch_is_a_final_failure_never_synced(tmp_path, corpus):
    """The trainer ends done having saved its checkpoints elsewhere (a bug moved its scratch): the last sync found
    nothing to sync. Before: `done: the run finished and its last checkpoint is synced`, exit 0, scratch removed,
    with nothing on run.remote. Now: failed for good, naming where it looked; scratch stays."""
    config = write_config(tmp_path, corpus, run={"keep_scratch": False})
    cfg = load_config(config)
    elsewhere = tmp_path / "elsewhere"
    status = run_supervisor(config, tmp_path, FAKE_CHECKPOINTS=str(elsewhere))
    log = (tmp_path / "supervisor.out").read_text()
    assert status == SUPERVISOR_GAVE_UP, log
    assert (elsewhere / "step-00000030").is_dir() and checkpoint.read_latest(Path(cfg.run.remote)) is None
    ended = state(cfg.run_dir)
    assert ended["phase"] == "failed" and "is synced" not in ended["reason"], ended
    assert "no checkpoint was synced" in ended["reason"] and str(cfg.checkpoint_dir) in ended["reason"], ended
    assert cfg.scratch_dir.is_dir() and (cfg.scratch_dir / "owner.json").is_file()
    assert not [e for e in events(cfg.run_dir) if e.get("event") == "scratch" and "removed" in e["message"]]
