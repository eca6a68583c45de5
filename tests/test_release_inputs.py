"""A run that fails for good gives back what it staged in scratch (RAM on a shared server): the corpus and the probe
did already; found by a new user, init.from's staged copy stayed (a 768x8 model's optimizer state: 767 MB of
/dev/shm) and a run that failed for good before its first checkpoint left its scratch holding its marker. A LoRA
run's base stays once it has checkpoints: its adapters need that very base."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from minilmd import checkpoint
from minilmd.config import load_config
from minilmd.protocol import FINAL_EXIT_STATUSES, SUPERVISOR_GAVE_UP
from supervisor_helpers import COPIES_THE_SAME, events, run_supervisor, write_config

pytestmark = pytest.mark.slow  # real supervisors


def _fake_pth(where: Path) -> Path:
    """A file init.from accepts as a MiniMind .pth before torch reads it (the fake trainer never loads it)."""
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_bytes(b"\0" * 300_000)
    return where


def _scratch_said(run_dir: Path) -> list[str]:
    return [e["message"] for e in events(run_dir) if e.get("event") == "scratch"]


def test_a_run_that_fails_for_good_gives_back_its_staged_init_copy_and_keeps_its_checkpoints(tmp_path, corpus):
    base = _fake_pth(tmp_path / "share" / "base.pth")
    config = write_config(tmp_path, corpus, remote=False, run={"keep_scratch": False},
                          init={"from": str(base)}, train={"max_steps": 20})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path) == 0
    assert (cfg.scratch_dir / "init" / "weights.pth").is_file()  # staged, and kept by the finished run (no remote)
    longer = write_config(tmp_path, corpus, remote=False, run={"keep_scratch": False},
                          init={"from": str(base)}, train={"max_steps": 40},
                          restart={"no_progress_limit": 2, "backoff_initial": "0.05s"})
    assert run_supervisor(longer, tmp_path, FAKE_OOM_ABOVE_MB="0") == SUPERVISOR_GAVE_UP
    assert not (cfg.scratch_dir / "init").exists() and not (cfg.scratch_dir / "corpus").exists()
    assert list((cfg.scratch_dir / "checkpoints").iterdir())  # the checkpoints stay
    said = _scratch_said(cfg.run_dir)
    assert any("removed the staged corpus, init from" in m and "its checkpoints stay" in m for m in said), said


def test_a_run_that_fails_for_good_before_its_first_checkpoint_removes_its_scratch(tmp_path, corpus):
    """A trainer that fails at its first step, with no restart allowed: the run fails for good. Its scratch held
    the marker and the staged corpus; both go, with the directory (this run's, by its marker). (The walk-through's
    case, device = cuda where there is none, is now refused before anything is made: tests/test_check_truth.py.)"""
    config = write_config(tmp_path, corpus, remote=False, run={"keep_scratch": False},
                          restart={"max_restarts": 0})
    cfg = load_config(config)
    status = run_supervisor(config, tmp_path, fake=False, MINILMD_FAULT="exception@1")
    assert status in FINAL_EXIT_STATUSES, (status, (tmp_path / "supervisor.out").read_text()[-3000:])
    assert not cfg.scratch_dir.exists(), sorted(p.name for p in cfg.scratch_dir.iterdir())
    said = _scratch_said(cfg.run_dir)
    assert any(m.startswith(f"removed {cfg.scratch_dir}: the run failed for good before its first checkpoint")
               for m in said), said


def test_a_lora_run_that_fails_for_good_keeps_its_staged_base_and_says_why(tmp_path, corpus):
    """The adapters in its checkpoints were trained on that very base; without a remote, its staged copy may be the
    only one (init.from may give other weights by the next start). On main it stayed without a word."""
    base = _fake_pth(tmp_path / "share" / "base.pth")
    lora = {"rank": 4, "alpha": 8.0}
    config = write_config(tmp_path, corpus, remote=False, run={"keep_scratch": False}, init={"from": str(base)},
                          lora=lora, train={"max_steps": 20})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path) == 0
    longer = write_config(tmp_path, corpus, remote=False, run={"keep_scratch": False}, init={"from": str(base)},
                          lora=lora, train={"max_steps": 40},
                          restart={"no_progress_limit": 2, "backoff_initial": "0.05s"})
    assert run_supervisor(longer, tmp_path, FAKE_OOM_ABOVE_MB="0") == SUPERVISOR_GAVE_UP
    assert (cfg.scratch_dir / "init" / "weights.pth").is_file() and not (cfg.scratch_dir / "corpus").exists()
    said = _scratch_said(cfg.run_dir)
    assert any(f"kept the staged init in {cfg.scratch_dir}: the LoRA base" in m for m in said), said


def test_a_relaunch_that_fails_for_good_before_its_own_checkpoint_says_the_remote_ones_are_untouched(tmp_path,
                                                                                                    corpus):
    """Found in review: a run with steps on run.remote, started again and refused at staging, removed its empty
    scratch saying `the run failed for good before its first checkpoint`: it read as work lost. Nothing was: the
    words say what the run has (the remote step state.json knows). The relaunch here meets a corpus damaged since
    (same size, other bytes: staging's hash check refuses it, final; a config of another model is now refused
    before anything is made, by the launch's own check: tests/test_check_resume.py)."""
    mine = tmp_path / "corpus-copy"
    shutil.copytree(corpus[0], mine)
    config = write_config(tmp_path, (mine, corpus[1]), run={"keep_scratch": False})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path) == 0
    assert not cfg.scratch_dir.exists()  # given back after the last sync: the checkpoints are on the remote alone
    tokens = mine / "train" / "tokens.bin"
    tokens.write_bytes(bytes(len(tokens.read_bytes())))
    # no_progress_limit 1: it gives up after one staging (its retries' pauses COPIES_THE_SAME's) instead of five
    other = write_config(tmp_path, (mine, corpus[1]), run={"keep_scratch": False}, train={"max_steps": 40},
                         restart={"no_progress_limit": 1})
    status = run_supervisor(other, tmp_path, quick=COPIES_THE_SAME)
    assert status in FINAL_EXIT_STATUSES, (status, (tmp_path / "supervisor.out").read_text()[-3000:])
    assert not cfg.scratch_dir.exists()  # it held the marker and the staged corpus alone
    last = _scratch_said(cfg.run_dir)[-1]
    assert last.startswith(f"removed {cfg.scratch_dir}: this launch failed for good before writing a checkpoint of "
                           f"its own; the run's checkpoints on run.remote (newest step 30) are untouched"), last
    assert checkpoint.read_latest(Path(cfg.run.remote)) == "step-00000030"  # and so they are
