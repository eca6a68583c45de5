"""Scratch on a small RAM disk (a real tmpfs mounted for the test), through `minilmd run`.

- A corpus that does not fit is refused before anything is copied, with the whole sum and a local-disk
  alternative, at launch and final (exit 2; no half copy left in scratch, no attempt).
- A checkpoint save that does not fit (another job filled /dev/shm) leaves the previous valid checkpoint; the
  trainer exits with the error in its log, the supervisor waits for room (no restart counted: see
  test_reliability_scratch_full.py), starts it again from that checkpoint, and the run finishes with the weights
  of an undisturbed run (the real trainer, a tiny model).
"""
from __future__ import annotations

import pytest

from filling import fill_leaving
from minilmd import checkpoint, checkpoint_dirs, scratch
from minilmd.config import load_config
from minilmd.daemon.jobs import staging
from minilmd.protocol import SUPERVISOR_CONFIG
from supervisor_helpers import events, model_sha, run_supervisor, start_supervisor, state, wait_for, write_config


def test_a_corpus_that_does_not_fit_the_ram_disk_is_refused_with_the_numbers(tmp_path, corpus, small_tmpfs):
    scratch = small_tmpfs("8m") / "scratch"
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": str(scratch)},
                          restart={"no_progress_limit": 1})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, timeout=60) == SUPERVISOR_CONFIG
    text = (tmp_path / "supervisor.out").read_text()
    assert "MB for the corpus" in text and "(tmpfs) has 8.4 MB free" in text and "set run.scratch to" in text, text
    assert not (scratch / "corpus").exists() and not list(scratch.glob(".tmp-corpus-*"))
    assert not (cfg.run_dir / "logs" / "attempt-0001.log").exists()


@pytest.mark.slow
def test_a_checkpoint_save_hitting_enospc_keeps_the_previous_one_and_the_run_recovers(tmp_path, corpus, small_tmpfs,
                                                                                      undisturbed):
    straight = undisturbed()  # 16 steps, a checkpoint every 4
    ckpt_bytes = sum(f.stat().st_size for f in straight.checkpoint.iterdir())

    disk = small_tmpfs("80m")
    config = straight.config_like(tmp_path, "s", run={"scratch": str(disk / "scratch")})
    cfg = load_config(config)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, False)  # this run's: a marker-less one is not adopted
    staging.stage(str(corpus[0]), cfg.scratch_dir)  # staged while there is room; the supervisor reuses it
    sup = start_supervisor(config, tmp_path / "sup.out", fake=False)
    filler = disk / "another-job"
    try:
        # another job fills the disk once the launch's space check has passed, while the trainer starts
        wait_for(lambda: state(cfg.run_dir).get("phase") == "starting", 60, "the trainer to be launched")
        assert fill_leaving(disk, int(1.5 * ckpt_bytes)) == filler  # room for one checkpoint and a half
        wait_for(lambda: state(cfg.run_dir).get("phase") == "waiting_space", 120, "the wait for space")
        first = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)
        assert [p.name for p in first] == ["step-00000004"]
        checkpoint.validate(first[0])  # the previous checkpoint is intact
        filler.unlink()
        assert sup.wait(180) == 0
    finally:
        if sup.poll() is None:
            sup.kill()
    st = state(cfg.run_dir)
    assert st["restarts"] == []
    assert [e["cause"] for e in events(cfg.run_dir) if "cause" in e] == ["scratch_full", "done"]
    assert "No space left on device" in (cfg.run_dir / "logs" / "attempt-0001.log").read_text()
    assert "resumed from" in (cfg.run_dir / "logs" / "attempt-0002.log").read_text()
    final = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    assert final.name == "step-00000016" and model_sha(final) == model_sha(straight.checkpoint)
    assert not list(cfg.checkpoint_dir.glob(".tmp-*"))
