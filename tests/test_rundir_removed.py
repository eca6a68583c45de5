"""run.dir removed while the run trains (an `rm -r` of old runs, a tmp cleaner): the supervisor says so in one line,
stops the trainer (it saves to scratch if it can), starts no other, makes the last sync and exits 73 (final), never a
traceback (daemon/phases/rundirwatch.py, runstate.dir_removed). Before (user report 9, finding 9), it died with three
chained FileNotFoundError tracebacks (state.json's temp file, events.jsonl) and exit 1."""
from __future__ import annotations

import shutil

import pytest

from minilmd import checkpoint_dirs, protocol
from minilmd.config import load_config
from minilmd.daemon.base.runstate import read_heartbeat
from supervisor_helpers import start_supervisor, wait_for, wait_or_kill, write_config


@pytest.mark.slow  # a real supervisor and the fake trainer
def test_a_run_dir_removed_mid_run_stops_the_run_with_one_line_and_the_last_sync(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 100_000, "checkpoint_every": 10})
    cfg = load_config(config)
    out = tmp_path / "sup.out"
    sup = start_supervisor(config, out, FAKE_STEP_S="0.05")
    try:
        wait_for(lambda: checkpoint_dirs.read_latest(cfg.run.remote) is not None, 120, "a first sync")
        wait_for(lambda: ((beat := read_heartbeat(cfg.run_dir)) is not None and (beat.step or 0) >= 25), 120,
                 "the trainer past step 25")
        shutil.rmtree(cfg.run_dir)
        rc = wait_or_kill(sup, 120)
    finally:
        if sup.poll() is None:
            sup.kill()
    text = out.read_text()
    assert rc == protocol.SUPERVISOR_RUN_DIR_FULL, text[-3000:]
    assert "Traceback" not in text and "FileNotFoundError" not in text, text[-3000:]
    assert text.count(f"minilmd run: run.dir {cfg.run_dir} was removed while the run ran (") == 1, text[-3000:]
    assert f"stopped because run.dir {cfg.run_dir} was removed while the run ran: not restarted (exit 73, final)" \
        in text, text[-3000:]
    assert "starting: attempt 2" not in text, text[-3000:]  # no trainer started into the missing run.dir
    newest = checkpoint_dirs.local_checkpoint_steps(cfg.checkpoint_dir)
    assert newest and checkpoint_dirs.read_latest(cfg.run.remote) == f"step-{newest[-1]:08d}", text[-3000:]
