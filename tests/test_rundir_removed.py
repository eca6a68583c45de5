"""run.dir removed while the run trains (an `rm -r` of old runs, a tmp cleaner): the supervisor says so in one line,
stops the trainer (it saves to scratch if it can), starts no other, makes the last sync and exits 73 (final), never a
traceback (daemon/phases/rundirwatch.py, fsio.dir_removed). Before (user report 9, finding 9), it died with three
chained FileNotFoundError tracebacks (state.json's temp file, events.jsonl) and exit 1."""
from __future__ import annotations

import shutil

import pytest

from minilmd import checkpoint_dirs, names, protocol
from minilmd.config import load_config
from minilmd.daemon.base.runstate import read_heartbeat
from minilmd.metrics import MetricsLog, RunDirGone
from minilmd.trainer.loop import entry, exits
from minilmd.trainer.loop.guards import StopFlag
from supervisor_helpers import remove_while_written, start_supervisor, wait_for, wait_or_kill, write_config


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
        remove_while_written(cfg.run_dir)  # the trainer's heartbeat and the supervisor's state.json go on
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


def test_the_trainers_writes_into_a_removed_run_dir_are_dropped_and_ask_the_loop_to_save_and_exit_73(tmp_path):
    """The trainer's side (minilmd/metrics.py RunDirWrites, the supervisor's rule: fsio.dir_removed): before, its
    heartbeat's ENOENT was raised, and the trainer died at its next beat with no save."""
    stop = StopFlag()
    log = MetricsLog(tmp_path / "run", writes=stop.writes)
    log.write("train", step=1)
    assert log.heartbeat(1, force=True) and not stop.requested
    shutil.rmtree(tmp_path / "run")
    assert not log.heartbeat(2, force=True)  # dropped, not raised
    log.write("train", step=2)
    assert stop.requested and stop.exit_status() == protocol.EXIT_RUN_DIR_FULL and stop.writes.dropped == 2
    assert stop.why().startswith(f"run.dir {tmp_path / 'run'} was removed while the trainer ran ("), stop.why()
    assert not (tmp_path / "run").exists()  # nothing made again


def test_a_trainer_started_by_a_supervisor_into_a_missing_run_dir_refuses_and_makes_nothing(tmp_path, corpus,
                                                                                           monkeypatch, capsys):
    """Under a supervisor run.dir was made before the launch: one missing at the trainer's start was removed since.
    Before, MetricsLog made it again (mkdir parents=True), a run.dir without the run's state.json or config copy."""
    cfg = load_config(write_config(tmp_path, corpus, remote=False))
    monkeypatch.setenv(names.RUN_DIR_ENV, str(cfg.run_dir))
    monkeypatch.setenv(names.SUPERVISOR_PROCESS_ENV, "1 1 not-this-host")  # a supervisor's, on another host
    assert not cfg.run_dir.exists()
    with pytest.raises(RunDirGone) as e:
        MetricsLog(cfg.run_dir)
    assert exits.status_of(cfg, e.value, None, 0) == protocol.EXIT_RUN_DIR_FULL
    assert entry.settle_run_dir_of(cfg) == protocol.EXIT_RUN_DIR_FULL  # `minilmd train`'s first step: not made
    assert not cfg.run_dir.exists()
    said = capsys.readouterr().err
    assert said.count(f"run.dir {cfg.run_dir} is not there (removed since the supervisor made it?)") == 2, said
    assert "Traceback" not in said, said


@pytest.mark.slow  # a real supervisor and the real trainer
def test_a_run_dir_removed_under_the_real_trainer_loses_no_step_past_the_save_it_makes(tmp_path, corpus):
    # no periodic save: the only checkpoint past the start is the one the removal makes it take
    config = write_config(tmp_path, corpus, train={"max_steps": 1000000, "checkpoint_every": 1000000,
                                                   "log_every": 1})
    cfg = load_config(config)
    out = tmp_path / "sup.out"
    sup = start_supervisor(config, out, fake=False)
    try:
        wait_for(lambda: ((beat := read_heartbeat(cfg.run_dir)) is not None and (beat.step or 0) >= 3), 600,
                 "three steps")
        before = read_heartbeat(cfg.run_dir).step
        remove_while_written(cfg.run_dir)
        rc = wait_or_kill(sup, 600)
    finally:
        if sup.poll() is None:
            sup.kill()
    text = out.read_text()
    assert rc == protocol.SUPERVISOR_RUN_DIR_FULL, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    newest = checkpoint_dirs.local_checkpoint_steps(cfg.checkpoint_dir)
    assert newest and newest[-1] >= before, (newest, before, text[-3000:])  # the trainer saved where it stopped
    assert checkpoint_dirs.read_latest(cfg.run.remote) == f"step-{newest[-1]:08d}", text[-3000:]  # and it was synced
