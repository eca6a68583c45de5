"""A run.dir full for a moment: the trainer's exit 73 is not the end when the supervisor finds room again.

Observed before (review 8, finding 1): a trainer whose metrics, heartbeat or log found run.dir full saved and exited
73, and the supervisor believed it: the run ended for good with exit 73 although its own state.json write had just
found room (another user's big file removed meanwhile), and waited for a person. Now the supervisor tests for room
itself (state.json written, the reserve whole): room again restarts the trainer from its save; a run.dir still full
ends the run with 73 after the last sync, as before.

Observed before (few_kib_left): a run.dir left with 16 KiB free counted as room again (state.json fits, the reserve
was whole already), and the trainer was restarted into a sure exit 73, a loop bounded only by
restart.no_progress_limit. Now room again means rundirwatch.RESTART_ROOM free: less ends the run with 73 as a full
one, no restart.

A real supervisor and the fake trainer (FAKE_RUN_DIR_FULL: it saves and exits 73 on a full run.dir, as the real
one does, tests/test_rundir_full_trainer.py), run.dir on a small tmpfs; the trainer's exit is held until the test
has emptied the disk or not (FAKE_STOP_HOLD), so the supervisor judges only then.
"""
from __future__ import annotations

import os

import pytest

from filling import fill, fill_leaving
from minilmd import checkpoint_dirs, names, protocol
from minilmd.config import load_config
from minilmd.daemon.base.runstate import EventLog, RunState, new_state, read_heartbeat
from minilmd.daemon.base.states import Cause, Phase
from minilmd.daemon.phases.rundirwatch import RESTART_ROOM, RunDirWatch
from supervisor_helpers import events, start_supervisor, state, wait_for, wait_or_kill, write_config


@pytest.mark.slow
@pytest.mark.parametrize("emptied", ["emptied", "stays_full", "few_kib_left", "few_kib_left_seen_full"])
def test_a_trainer_that_found_run_dir_full_is_restarted_once_there_is_room_again(tmp_path, corpus, small_tmpfs,
                                                                                emptied):
    disk = small_tmpfs("4m")
    config = write_config(tmp_path, corpus, run={"dir": str(disk / "run"), "remote": str(tmp_path / "remote")},
                          train={"max_steps": 30, "checkpoint_every": 10})
    cfg = load_config(config)
    go, release = tmp_path / "go", tmp_path / "release"
    out = tmp_path / "sup.out"
    sup = start_supervisor(config, out, FAKE_RUN_DIR_FULL="1", FAKE_HOLD=f"5:{go}",
                           FAKE_STOP_HOLD=f"after:{release}")
    try:
        wait_for(lambda: ((read_heartbeat(cfg.run_dir) or _NoBeat).step or 0) >= 5, 120, "the trainer at step 5")
        filler = fill(disk)
        go.touch()
        wait_for(lambda: release.with_name("release.holding").exists(), 120, "the trainer's save on a full run.dir")
        if emptied == "few_kib_left_seen_full":  # the supervisor's own state.json write found it full, and said so
            wait_for(lambda: f"run.dir {cfg.run_dir} is full (" in out.read_text(), 120, "the supervisor's full line")
        if emptied != "stays_full":
            filler.unlink()  # the other user's file is gone before the supervisor judges the trainer's exit 73
        if emptied.startswith("few_kib_left"):
            filler = fill_leaving(disk, 16 << 10)  # and another one takes all but 16 KiB
        release.touch()
        rc = wait_or_kill(sup, 120)
    finally:
        if sup.poll() is None:
            sup.kill()
    text = out.read_text()
    assert "run_dir_full (exit 73)" in text, text[-3000:]  # the trainer did exit 73
    st = state(cfg.run_dir)
    if emptied == "emptied":
        assert rc == 0, text[-3000:]
        assert st["phase"] == "done", st.get("reason")
        assert [r["cause"] for r in st["restarts"]] == ["run_dir_full"], st["restarts"]
        assert checkpoint_dirs.read_latest(cfg.run.remote) == "step-00000030", text[-3000:]
    else:
        assert rc == protocol.SUPERVISOR_RUN_DIR_FULL, text[-3000:]
        assert st["outcome"]["exit"] == protocol.SUPERVISOR_RUN_DIR_FULL and "run.dir is full" in st["reason"], st
        assert st["restarts"] == [], st["restarts"]  # no restart into a sure exit 73
        if emptied.startswith("few_kib_left"):
            assert "free, under the 1 MiB a restarted trainer needs there" in st["reason"], st["reason"]
        said = [e["message"] for e in events(cfg.run_dir) if e["event"] == "disk"]
        assert not [m for m in said if "has room again" in m], said  # no room for a trainer: never "room again"
        if emptied == "few_kib_left_seen_full":  # its writes go through again: said as what it is, before the stop
            assert said[-1].startswith(f"run.dir {cfg.run_dir}: state.json and events are written again, but ") \
                and said[-1].endswith("free, under the 1 MiB a restarted trainer needs there"), said
        assert checkpoint_dirs.read_latest(cfg.run.remote) == "step-00000006", text[-3000:]  # its save, synced
        filler.unlink()


class _NoBeat:
    step = 0


def test_room_again_after_an_exit_73_is_room_for_a_restarted_trainer_not_a_few_kib(tmp_path, small_tmpfs):
    """still_full after a trainer's exit 73, on a real tmpfs: 16 KiB free takes state.json and the events (the
    reserve is whole already) but is no room for a restart; RESTART_ROOM free is."""
    disk = small_tmpfs("4m")
    run_dir = disk / "run"
    run_dir.mkdir()
    events = EventLog(run_dir, echo=False)
    room = RunDirWatch(None, run_dir, RunState(run_dir / names.STATE, new_state("s", run_dir, "c.toml")), events)
    filler = fill_leaving(disk, 16 << 10)
    assert room.still_full(Phase.TRAINING, Cause.RUN_DIR_FULL)
    assert room.full is None and room.short and room.short.endswith(
        "free, under the 1 MiB a restarted trainer needs there")  # its own writes went through
    assert "free, under the 1 MiB" in room.stop("the trainer ended (run_dir_full)")
    assert not room.still_full(Phase.TRAINING, Cause.CRASH)  # a crash is not judged by the floor
    filler.unlink()
    assert RESTART_ROOM < os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    assert not room.still_full(Phase.TRAINING, Cause.RUN_DIR_FULL)
    events.close()


def _full_watch(tmp_path, small_tmpfs):
    """A RunDirWatch on a real 4 MiB tmpfs whose state.json write has found it full (said on stdout), the filler
    still there: (the watch, its EventLog, run.dir, the filler)."""
    from types import SimpleNamespace

    disk = small_tmpfs("4m")
    run_dir = disk / "run"
    run_dir.mkdir()
    log = EventLog(run_dir, echo=False)
    cfg = SimpleNamespace(checkpoint_dir=tmp_path / "checkpoints", run=SimpleNamespace(remote=""))
    room = RunDirWatch(cfg, run_dir, RunState(run_dir / names.STATE, new_state("s", run_dir, "c.toml")), log)
    filler = fill(disk)
    room.save()
    room.watch(Phase.TRAINING)
    assert room.full and room.full.startswith("state.json: "), room.full
    return room, log, run_dir, filler


def test_room_again_is_room_for_a_trainer_not_the_few_kib_a_trainers_exit_frees(tmp_path, small_tmpfs):
    """Seen before: `[disk] run.dir ... has room again` just before `stopped because run.dir is full`: a trainer's
    exit 73 freed the few KiB its files held, state.json fit in them, the watch said room again, and still_full then
    stopped the run for RESTART_ROOM not free. Now room again is RESTART_ROOM; less is said as what it is."""
    room, log, run_dir, filler = _full_watch(tmp_path, small_tmpfs)
    filler.unlink()
    fill_leaving(run_dir.parent, 16 << 10)  # what the trainer's exit freed
    assert room.still_full(Phase.TRAINING, Cause.RUN_DIR_FULL)
    said = [e["message"] for e in events(run_dir)]
    assert said[-1].startswith(f"run.dir {run_dir}: state.json and events are written again, but ") and \
        said[-1].endswith("free, under the 1 MiB a restarted trainer needs there"), said
    assert not [m for m in said if "has room again" in m], said
    assert "while run.dir is full (" in room.stop("the trainer ended (run_dir_full)")
    log.close()


def test_room_that_comes_back_while_the_stop_for_a_full_run_dir_goes_on_is_in_the_stop_line(tmp_path, small_tmpfs):
    """The stop for a full run.dir is decided and not undone; room that comes back during its last sync is said in
    the events, and the stop line said `is full ... free space in run.dir` after it. Now it says the run stopped
    although the room came back."""
    room, log, run_dir, filler = _full_watch(tmp_path, small_tmpfs)
    assert room.still_full(Phase.TRAINING, Cause.RUN_DIR_FULL)
    room.stop("the trainer ended (run_dir_full)")
    filler.unlink()  # room for a trainer, while the last sync runs
    room.save()
    room.watch(Phase.STOPPING)
    assert [e["message"] for e in events(run_dir)][-1] == \
        f"run.dir {run_dir} has room again: state.json and events are written"
    outcome = room.outcome("")
    assert outcome.startswith("stopped because run.dir was full (state.json: ") and "though it has room again " \
        "since (the stop was under way): not restarted (exit 73, final)" in outcome, outcome
    assert "free space in" not in outcome, outcome
    log.close()


def test_room_that_comes_back_after_the_few_kib_is_said_once_and_in_the_stop_line(tmp_path, small_tmpfs):
    """After the few KiB were said as what they are, the room for a trainer that comes back later is said too (once),
    and the stop line says it (review, stop 65: the few-KiB line was the last word: `free space in run.dir` on a disk
    with room)."""
    room, log, run_dir, filler = _full_watch(tmp_path, small_tmpfs)
    filler.unlink()
    tight = fill_leaving(run_dir.parent, 16 << 10)
    assert room.still_full(Phase.TRAINING, Cause.RUN_DIR_FULL)
    room.stop("the trainer ended (run_dir_full)")
    tight.unlink()  # room for a trainer, while the last sync runs
    for _ in range(3):
        room.save()
        room.watch(Phase.STOPPING)
    said = [e["message"] for e in events(run_dir)]
    assert said.count(f"run.dir {run_dir} has room again: state.json and events are written") == 1, said
    outcome = room.outcome("")
    assert "though it has room again since (the stop was under way)" in outcome, outcome
    log.close()
