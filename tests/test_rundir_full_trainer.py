"""run.dir's file system fills under the real trainer (a real tmpfs holds run.dir; scratch and the remote are
elsewhere).

Observed before: the trainer died on the ENOSPC of its heartbeat (fsio.atomic_write_text, exit 1) without a save;
the supervisor synced the newest checkpoint and stopped with exit 73, and the restart lost every step since the
last periodic save (up to checkpoint_every: 5 minutes by default). Now the trainer's writes into run.dir (metrics,
heartbeat, its log) are dropped and counted on a full disk, never raised; the loop stops at the next step boundary,
saves to scratch, and exits 73; the supervisor syncs that save and stops with exit 73, and `status` says so.
"""
from __future__ import annotations

import errno
import io
import signal

import pytest

from filling import fill
from minilmd import checkpoint_dirs, names, protocol
from minilmd.config import load_config
from minilmd.daemon.base.runstate import read_heartbeat
from minilmd.metrics import MetricsLog, RunDirWrites
from minilmd.trainer.loop.exits import StoppedInPass, crashed
from minilmd.trainer.loop.guards import OutputOnFullDisk, StopFlag
from supervisor_helpers import cli, start_supervisor, state, wait_for, wait_or_kill, write_config


class FullFile(io.StringIO):
    """A stream whose every flush finds the disk full."""

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_writes_into_a_full_run_dir_are_dropped_and_counted_and_ask_the_loop_to_stop(tmp_path, small_tmpfs):
    disk = small_tmpfs("256k")
    stop = StopFlag()
    log = MetricsLog(disk / "run", writes=stop.writes)
    log.write("train", step=1)
    assert log.heartbeat(1, force=True) and not stop.requested
    filler = fill(disk)
    for step in range(2, 200):  # the last page of metrics.jsonl takes a few more lines first
        log.write("train", step=step, pad="x" * 200)
        if stop.requested:
            break
    assert not log.heartbeat(step, force=True)  # no room for its temp file: dropped, not raised
    assert stop.requested and stop.exit_status() == protocol.EXIT_RUN_DIR_FULL
    assert stop.writes.dropped >= 2 and "No space left" in stop.writes.full
    assert stop.why().startswith("run.dir is full (no room to write ")
    filler.unlink()
    assert log.heartbeat(step, force=True)
    assert read_heartbeat(disk / "run").step == step


def test_a_print_into_a_full_log_is_dropped_and_other_errors_still_raise():
    writes = RunDirWrites()
    out = OutputOnFullDisk(FullFile(), writes, "its log (stdout)")
    print("step 5", file=out, flush=True)
    assert writes.dropped == 1 and writes.full == "no room to write its log (stdout): No space left on device"

    class Broken(io.StringIO):
        def flush(self) -> None:
            raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError):
        print("x", file=OutputOnFullDisk(Broken(), writes, "its log"), flush=True)
    plain = StopFlag()
    assert not plain.requested and plain.exit_status() == protocol.EXIT_STOPPED


@pytest.mark.parametrize("full", [True, False], ids=["run_dir_full", "sigterm"])
def test_a_stop_in_the_dpo_reference_pass_exits_with_the_stops_own_status_and_reason(full, capsys):
    """Observed before (review 8, finding 2): a full run.dir during DPO's reference pass exited 75, "stop received":
    the supervisor took it for a SIGTERM it did not send and restarted into the full run.dir. Now the pass's stop
    carries the StopFlag's reason and status: 73 for a full run.dir, 75 for a signal."""
    stop = StopFlag()
    if full:
        print("pair 7", file=OutputOnFullDisk(FullFile(), stop.writes, "its log (stdout)"), flush=True)
    else:
        stop._handle(signal.SIGTERM, None)
    assert stop.requested
    code = crashed(None, StoppedInPass(stop.why(), stop.exit_status(), 7, 30), None, 0)  # as the pass raises it
    said = capsys.readouterr().out
    if full:
        assert code == protocol.EXIT_RUN_DIR_FULL and "run.dir is full (no room to write its log" in said, said
    else:
        assert code == protocol.EXIT_STOPPED and "SIGTERM received during the DPO reference pass (7/30" in said, said


@pytest.mark.slow
def test_a_run_dir_that_fills_under_the_real_trainer_loses_no_step_past_the_save_it_makes(tmp_path, corpus,
                                                                                        small_tmpfs):
    disk = small_tmpfs("4m")
    # no periodic save: the only checkpoint past the start is the one the full run.dir makes it take
    config = write_config(tmp_path, corpus, run={"dir": str(disk / "run"), "remote": str(tmp_path / "remote")},
                          train={"max_steps": 1000000, "checkpoint_every": 1000000, "log_every": 1})
    cfg = load_config(config)
    out = tmp_path / "sup.out"
    sup = start_supervisor(config, out, fake=False)
    try:
        wait_for(lambda: ((read_heartbeat(cfg.run_dir) or _NoBeat).step or 0) >= 3, 600, "three steps")
        before = read_heartbeat(cfg.run_dir).step
        filler = fill(disk)
        rc = wait_or_kill(sup, 600)
    finally:
        if sup.poll() is None:
            sup.kill()
    text = out.read_text()
    assert rc == protocol.SUPERVISOR_RUN_DIR_FULL, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    newest = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    assert names.step_of(newest.name) >= before, (newest.name, before, text[-3000:])  # saved where it stopped
    assert checkpoint_dirs.read_latest(cfg.run.remote) == newest.name, text[-3000:]  # and synced
    st = state(cfg.run_dir)
    assert st["outcome"]["exit"] == protocol.SUPERVISOR_RUN_DIR_FULL, st.get("reason")
    assert "run.dir is full" in st["reason"] and newest.name in st["reason"], st["reason"]
    assert "run_dir_full (exit 73)" in text, text[-3000:]  # the child_exit event, in the journal
    status = cli("status", str(cfg.run_dir)).stdout
    assert "exit 73" in status and newest.name in status, status
    filler.unlink()


class _NoBeat:
    step = 0
