"""`minilmd status` once no supervisor keeps state.json up to date (daemon/views/newest.py): a supervisor killed with
SIGKILL leaves its trainer training and saving, and `stop` lets it save once more. status then takes the step and
the newest checkpoint from what the trainer wrote after state.json (metrics.jsonl's end, the heartbeat, scratch's
checkpoint directories), the same checkpoint `stop` reports, and never says "training for" of a run nothing trains.
"""
from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from minilmd import names, procs
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state, read_heartbeat
from minilmd.daemon.child.orphans import record_launch
from minilmd.daemon.host import registry
from minilmd.daemon.views import overview
from minilmd.daemon.views import status as views
from minilmd.daemon.views import stop as views_stop
from minilmd.fsio import atomic_write_json
from supervisor_helpers import cli, start_supervisor, state, wait_for, write_config


def killed_run(tmp_path: Path, saved: tuple[int, ...] = (50,)) -> tuple[Path, Path]:
    """A run whose supervisor was SIGKILLed at step 169 (its state.json: the checkpoint of step 50, a remote with
    none yet); `saved` are the checkpoint directories in scratch. Returns (run dir, checkpoint root)."""
    run_dir, root = tmp_path / "run", tmp_path / "scratch" / names.CHECKPOINTS
    run_dir.mkdir()
    root.mkdir(parents=True)
    for step in saved:
        (root / names.step_name(step)).mkdir()
        (root / names.step_name(step) / names.MANIFEST).write_text("{}")
    t = time.time() - 60
    st = new_state("tiny", run_dir, str(tmp_path / "tiny.toml"))
    st.update(phase="training", since=t - 17, updated=t,
              supervisor={"pid": 999999, "start_ticks": 1, "host": socket.gethostname(), "started": t - 30},
              progress={"step": 169, "total_steps": 3000, "loss": 7.5, "updated": t},
              local_checkpoint={"step": 50, "time": t - 10, "path": str(root / names.step_name(50))},
              sync={"state": "ok", "since": t, "error": None, "attempts": 1},
              remote_checkpoint=None)
    atomic_write_json(run_dir / names.STATE, st)
    return run_dir, root


def status_text(run_dir: Path) -> str:
    out = io.StringIO()
    assert views.status(run_dir, out=out) == 0
    return out.getvalue()


def test_status_takes_step_and_checkpoint_from_what_the_trainer_wrote_after_the_supervisor_died(tmp_path):
    run_dir, root = killed_run(tmp_path, saved=(50, 250))
    t = time.time() - 5
    lines = [{"kind": "train", "step": 100, "total_steps": 3000, "loss": 7.9, "time": t - 100},  # before state.json
             {"kind": "checkpoint", "step": 250, "path": str(root / names.step_name(250)), "time": t - 1},
             {"kind": "train", "step": 253, "total_steps": 3000, "loss": 6.25, "time": t}]
    (run_dir / names.METRICS).write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    text = status_text(run_dir)
    assert "step 253/3,000" in text and "loss 6.2500" in text, text
    assert "local checkpoint: step 250 (" in text and "step 50" not in text, text
    assert "training for" not in text and "not running (last seen" in text, text


def test_a_killed_supervisors_last_reason_is_not_said_as_why_the_run_is_where_it_is(tmp_path):
    """user10 #6: after `kill -9` of the supervisor, status said "not running (... killed or crashed ...)" and then
    "why: training, since the first heartbeat ..." as if training went on."""
    run_dir, _ = killed_run(tmp_path)
    st = json.loads((run_dir / names.STATE).read_text())
    atomic_write_json(run_dir / names.STATE, {**st, "reason": "first heartbeat from attempt 1 (step 0)"})
    text = status_text(run_dir)
    assert "not running (last seen" in text and "  why:" not in text, text
    assert "  last reason: training, since the first heartbeat from attempt 1 (step 0)" in text, text


def status_json(run_dir: Path) -> dict:
    out = io.StringIO()
    assert views.status(run_dir, as_json=True, out=out) == 0
    return json.loads(out.getvalue())


def orphan_wrote_on(run_dir: Path, root: Path) -> None:
    """What the orphaned trainer wrote after state.json: its save of step 250 logged, step 253 trained, and the save
    of step 260 `stop` let finish, in scratch only (its metrics line never written)."""
    (root / names.step_name(260)).mkdir()
    (root / names.step_name(260) / names.MANIFEST).write_text("{}")
    t = time.time() - 5
    lines = [{"kind": "checkpoint", "step": 250, "path": str(root / names.step_name(250)), "time": t - 1},
             {"kind": "train", "step": 253, "total_steps": 3000, "loss": 6.25, "time": t}]
    (run_dir / names.METRICS).write_text("".join(json.dumps(rec) + "\n" for rec in lines))


def test_status_json_says_the_step_and_checkpoint_plain_status_says(tmp_path):
    """`status --json` printed state.json as the dead supervisor left it (step 169, checkpoint 50) while plain
    status showed the orphan's step 253 and its checkpoint 260: scripts saw an older run than the operator."""
    run_dir, root = killed_run(tmp_path, saved=(50, 250))
    orphan_wrote_on(run_dir, root)
    written = json.loads((run_dir / names.STATE).read_text())
    text = status_text(run_dir)
    plain_step = re.search(r"\n  step ([\d,]+)/", text)
    plain_local = re.search(r"local checkpoint: step (\d+) \(", text)
    assert plain_step and plain_local, text
    shown = status_json(run_dir)
    state = shown["state"]
    assert state["progress"]["step"] == int(plain_step.group(1).replace(",", "")) == 253, state["progress"]
    assert state["local_checkpoint"]["step"] == int(plain_local.group(1)) == 260, state["local_checkpoint"]
    assert state["local_checkpoint"]["path"] == str(root / names.step_name(260))
    assert shown["caught_up"] is True and shown["running"] is False
    assert set(state) == set(written), set(state) ^ set(written)  # state.json's shape: its consumers read it as ever
    assert {k: v for k, v in state.items() if k not in ("progress", "local_checkpoint")} == {
        k: v for k, v in written.items() if k not in ("progress", "local_checkpoint")}


def test_status_json_is_state_json_itself_when_the_trainer_wrote_nothing_newer(tmp_path):
    run_dir, _ = killed_run(tmp_path)
    written = json.loads((run_dir / names.STATE).read_text())
    written["from_a_newer_minilmd"] = {"kept": True}  # a key this version does not know: passed on untouched
    atomic_write_json(run_dir / names.STATE, written)
    shown = status_json(run_dir)
    assert shown["state"] == written and shown.get("caught_up") is False, shown


def test_status_all_json_rows_take_the_step_plain_status_shows(tmp_path, monkeypatch):
    """`status --all` (its table and --json rows) read state.json alone, a step behind plain `status`."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "absent"))
    run_dir, root = killed_run(tmp_path, saved=(50, 250))
    orphan_wrote_on(run_dir, root)
    registry.register("tiny", run_dir, tmp_path / "tiny.toml")
    out = io.StringIO()
    assert overview.status_all(as_json=True, out=out) == 0
    [row] = json.loads(out.getvalue())
    assert (row["step"], row["loss"], row.get("caught_up"), row["running"]) == (253, 6.25, True, False), row
    out = io.StringIO()
    assert overview.status_all(out=out) == 0
    header, row_line = out.getvalue().splitlines()[:2]  # the STEP cell alone: RUN_DIR holds pytest's base (3169...)
    step_cell = row_line[header.index("STEP"):header.index("LOSS")].strip()
    assert step_cell == "253/3,000", out.getvalue()


def test_a_killed_supervisors_trainer_that_trains_on_is_said_in_the_first_line_and_the_overview(tmp_path,
                                                                                                 monkeypatch):
    """Walk 4 #7: status said "not running (last seen ...)" first and `status --all` "training (not running)" while
    the same screen said the trainer still ran. The trainer here is a real process carrying the run's directory and
    launch id (trainer.json records it), as the orphan hunt finds one."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "absent"))
    run_dir, _ = killed_run(tmp_path)
    registry.register("tiny", run_dir, tmp_path / "tiny.toml")
    launch_id = "ab" * 16
    trainer = subprocess.Popen(["sleep", "600"], env={**os.environ, names.RUN_DIR_ENV: str(run_dir.resolve()),
                                                      names.LAUNCH_ID_ENV: launch_id})
    try:
        record_launch(run_dir, 1, launch_id, trainer.pid, procs.process_start_ticks(trainer.pid))
        head = status_text(run_dir).splitlines()[0]
        assert "supervisor not running (killed or crashed, last seen " in head and (
            f"in training) but its trainer is (pid {trainer.pid}): `minilmd run` again stops that trainer (it saves "
            f"first) and resumes") in head, head
        assert f"trainer still running without its supervisor: pid {trainer.pid}" in status_text(run_dir)
        out = io.StringIO()
        assert overview.status_all(out=out) == 0
        assert "training (trainer without supervisor)" in out.getvalue() and "not running" not in out.getvalue(), \
            out.getvalue()
    finally:
        trainer.kill()
        trainer.wait()
    assert "not running (last seen" in status_text(run_dir).splitlines()[0]  # gone too: nothing trains
    out = io.StringIO()
    assert overview.status_all(out=out) == 0
    assert "training (not running)" in out.getvalue(), out.getvalue()


def test_status_names_the_checkpoint_stop_names_when_only_scratch_has_it(tmp_path):
    """The orphan `stop` let save (step 253) is in no file but scratch: status and stop agree on it."""
    run_dir, root = killed_run(tmp_path, saved=(50, 253))
    os.mkfifo(run_dir / names.METRICS)  # a metrics.jsonl that is no file: never opened
    (root / "step-00000900").mkdir()  # a save cut off before its manifest: not a checkpoint
    out = io.StringIO()
    assert views_stop.stop(run_dir, out=out) == 3
    assert "the newest checkpoint, step 253, is only in scratch" in out.getvalue(), out.getvalue()
    text = status_text(run_dir)
    assert "local checkpoint: step 253 (" in text and "step 900" not in text, text
    assert "training for" not in text, text


def test_a_heartbeat_newer_than_state_json_moves_the_step(tmp_path):
    run_dir, _ = killed_run(tmp_path)
    (run_dir / names.HEARTBEAT).write_text("194\n")  # written now: after state.json
    assert "step 194/3,000" in status_text(run_dir)


def test_metrics_lines_of_the_wrong_types_are_skipped_the_others_taken(tmp_path):
    run_dir, root = killed_run(tmp_path, saved=(50, 120))
    t = time.time()
    bad = {"kind": "train", "step": "lots", "total_steps": [1], "loss": {"a": 1}, "time": t}
    good = {"kind": "checkpoint", "step": 120, "path": str(root / names.step_name(120)), "time": t}
    (run_dir / names.METRICS).write_text(json.dumps(bad) + "\n" + json.dumps(good) + "\n")
    text = status_text(run_dir)  # no traceback from a string step, and state.json's numbers stand
    assert "step 169/3,000" in text and "loss 7.5000" in text and "local checkpoint: step 120 (" in text, text


def test_a_restart_before_the_first_step_says_no_step(tmp_path):
    run_dir, _ = killed_run(tmp_path)
    state = json.loads((run_dir / names.STATE).read_text())
    state["restarts"] = [{"time": time.time() - 5, "cause": "crash", "step": None, "action": "restart", "exit": 1}]
    atomic_write_json(run_dir / names.STATE, state)
    text = status_text(run_dir)
    assert "restarts: 1 (last: crash, " in text and "None" not in text, text


@pytest.mark.slow
def test_a_killed_supervisors_run_shows_the_step_and_checkpoint_stop_finds(tmp_path, corpus):
    """The reviewer's story with real processes: the supervisor SIGKILLed, its trainer trains on; status shows the
    trainer's newer step; `stop` ends the trainer (it saves) and says which checkpoint is only in scratch; status
    after the stop names that one, not the one the dead supervisor last wrote, and says nothing trains."""
    config = write_config(tmp_path, corpus, train={"max_steps": 100000, "checkpoint_every": 50})
    cfg = load_config(config)
    sup = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.02")
    wait_for(lambda: (state(cfg.run_dir).get("local_checkpoint") or {}).get("step"), 60, "a first save")
    sup.send_signal(signal.SIGKILL)
    sup.wait(30)
    left = state(cfg.run_dir)
    step_then = left["progress"]["step"]
    wait_for(lambda: _beat_step(cfg.run_dir) > step_then + 120, 60, "the orphan's steps")
    shown = re.search(r"  step ([\d,]+)", cli("status", str(cfg.run_dir)).stdout)
    assert shown and int(shown.group(1).replace(",", "")) > step_then + 100, (step_then, shown)
    stopped = cli("stop", str(cfg.run_dir), timeout=200)
    newest = re.search(r"the newest checkpoint, step (\d+), is only in scratch", stopped.stdout)
    assert stopped.returncode == 3 and newest, stopped.stdout + stopped.stderr
    assert int(newest.group(1)) > left["local_checkpoint"]["step"]
    text = cli("status", str(cfg.run_dir)).stdout
    assert f"local checkpoint: step {newest.group(1)} (" in text and "training for" not in text, text


def _beat_step(run_dir: Path) -> int:
    beat = read_heartbeat(run_dir)
    return beat.step if beat is not None and beat.step is not None else 0
