"""run.dir's filesystem full (a real tmpfs, mounted for the test).

Observed before: the supervisor died with a ~300-line traceback (each write of state.json/events.jsonl in the error
path raised again) and exit 1, which systemd restarts every 30 s, forever.

- A write of state.json, events.jsonl or supervisor.log that finds the disk full does not raise: the supervisor
  says it once on stdout (the journal), keeps the state in memory and writes again once there is room.
- The trainer cannot live without its run directory (heartbeat, metrics, log); when it ends while run.dir is full
  the supervisor does not restart it: it makes the last sync (the checkpoints are in scratch, on another
  filesystem), then stops with one message and exit 73, which systemd does not restart; a small reserve file it
  kept in run.dir is given up so that state.json and the last events still say what happened.
- A supervisor started on a full run.dir exits 73 with one line, no traceback.
"""
from __future__ import annotations

import json
import os
import re

import pytest

from filling import fill
from minilmd import checkpoint_dirs, names, protocol
from minilmd.config import load_config
from minilmd.daemon.base.runstate import EventLog, RunState, new_state
from supervisor_helpers import cli, start_supervisor, state, wait_for, wait_or_kill, write_config


def test_state_and_event_writes_on_a_full_disk_do_not_raise_and_resume_when_there_is_room(tmp_path, small_tmpfs,
                                                                                        capsys):
    disk = small_tmpfs("256k")
    run_dir = disk / "run"
    run_dir.mkdir()
    events = EventLog(run_dir, echo=True)
    st = RunState(run_dir / names.STATE, new_state("s", run_dir, "c.toml"))
    st.save()
    events.emit("start", "hello")
    filler = fill(disk)
    st["reason"] = "while full"
    st.save()  # no exception
    assert st.unwritten and "No space left" in st.unwritten
    for i in range(500):  # the last page of each log takes a few more lines first
        events.emit("sync", f"while full {i} " + "x" * 100)
        if events.unwritten:
            break
    assert events.unwritten and "No space left" in events.unwritten
    out = capsys.readouterr().out
    assert f"[sync] while full {i} " in out  # the journal still gets every event
    filler.unlink()
    st.save()
    events.emit("sync", "room again")
    events.close()
    assert st.unwritten is None and events.unwritten is None
    assert '"reason": "while full"' in (run_dir / names.STATE).read_text()
    lines = (run_dir / names.EVENTS).read_text().splitlines()
    assert [json.loads(line)["message"] for line in lines][-1] == "room again"  # no half line before it
    log = (run_dir / names.SUPERVISOR_LOG).read_text().splitlines()
    assert log[-1].endswith("[sync] room again")
    assert all(len(re.findall(r"\d\d:\d\d:\d\d \[", line)) == 1 for line in log), log  # one event a line


@pytest.mark.slow
def test_a_run_dir_that_fills_up_stops_the_run_cleanly_with_a_final_status(tmp_path, corpus, small_tmpfs):
    disk = small_tmpfs("4m")
    config = write_config(tmp_path, corpus, run={"dir": str(disk / "run")},
                          train={"max_steps": 100000, "checkpoint_every": 20})
    cfg = load_config(config)
    out = tmp_path / "sup.out"
    sup = start_supervisor(config, out, FAKE_STEP_S="0.02")
    try:
        wait_for(lambda: (state(cfg.run_dir).get("remote_checkpoint") or {}).get("step"), 60, "a first sync")
        assert (cfg.run_dir / names.RUN_DIR_RESERVE).is_file()
        mark = len(out.read_text())
        filler = fill(disk)
        rc = wait_or_kill(sup, 120)
    finally:
        if sup.poll() is None:
            sup.kill()
    text = out.read_text()
    after = text[mark:]
    assert rc == protocol.SUPERVISOR_RUN_DIR_FULL and rc in protocol.FINAL_EXIT_STATUSES, text[-3000:]
    assert "Traceback" not in text and "During handling" not in text, text[-3000:]
    assert after.count(f"run.dir {cfg.run_dir} is full") == 1, after  # said once, not at every write
    assert len(after.splitlines()) < 40, after
    # the last sync ran: the newest checkpoint in scratch is on the remote too
    newest = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    assert checkpoint_dirs.read_latest(cfg.run.remote) == newest.name, (newest, after)
    # the reserve made room for the final state: status tells what happened, even with the disk still full
    st = state(cfg.run_dir)
    assert st["phase"] == "failed" and st["outcome"]["exit"] == protocol.SUPERVISOR_RUN_DIR_FULL, st.get("reason")
    assert "is full" in st["reason"] and newest.name in st["reason"], st["reason"]
    status = cli("status", str(cfg.run_dir)).stdout
    assert "failed" in status and "exit 73" in status, status
    filler.unlink()


@pytest.mark.slow
def test_a_supervisor_started_on_a_full_run_dir_exits_final_with_one_line(tmp_path, corpus, small_tmpfs):
    disk = small_tmpfs("256k")
    config = write_config(tmp_path, corpus, run={"dir": str(disk / "run")})
    fill(disk)
    out = tmp_path / "sup.out"
    rc = wait_or_kill(start_supervisor(config, out), 60)
    text = out.read_text()
    assert rc == protocol.SUPERVISOR_RUN_DIR_FULL, text
    assert len(text.strip().splitlines()) == 1 and "is full" in text and "Traceback" not in text, text
    assert not os.path.exists(disk / "run" / names.STATE)
