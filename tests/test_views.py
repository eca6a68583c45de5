"""`minilmd status`, `logs`, `stop` on run directories written by hand: every state the operator may meet."""
from __future__ import annotations

import io
import json
import re
import socket
import time
from pathlib import Path

from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.views import status as views
from minilmd.daemon.views import stop as views_stop
from minilmd.fsio import atomic_write_json


def write_run(tmp_path: Path, **changes) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    st = new_state("demo", run_dir, str(tmp_path / "demo.toml"))
    for key, value in changes.items():
        st[key] = value
    atomic_write_json(run_dir / "state.json", st)
    return run_dir


def status_text(run_dir: Path, as_json: bool = False) -> tuple[int, str]:
    out = io.StringIO()
    rc = views.status(run_dir, as_json=as_json, out=out)
    return rc, out.getvalue()


def test_status_of_a_live_training_run(tmp_path):
    t = time.time()
    run_dir = write_run(
        tmp_path, phase="training", since=t - 600,
        child={"pid": 4242, "attempt": 3, "log": "logs/attempt-0003.log"},
        progress={"step": 1200, "total_steps": 5000, "loss": 3.21, "val_loss": 3.4, "tok_s": 4500.0, "eta_s": 840,
                  "heartbeat": t - 1, "lr": 1e-4, "tokens_seen": 1, "updated": t},
        local_checkpoint={"step": 1000, "time": t - 120, "path": "x"},
        remote_checkpoint={"step": 1000, "time": t - 60, "verified": True, "path": "y"},
        sync={"state": "ok", "since": t, "error": None, "attempts": 1},
        restarts=[{"time": t - 300, "cause": "sigbus", "step": 800, "action": "restage", "exit": -7}],
        overrides={"train.micro_batch_size": 16, "train.grad_accum": 2})
    rc, text = status_text(run_dir)  # our own pid is the "supervisor" in new_state: alive
    assert rc == 0
    assert "demo" in text and "training for 10m" in text and "running" in text
    assert "step 1,200/5,000 (24.0%)" in text and "loss 3.2100" in text and "4,500 tok/s" in text
    assert "lr 0.0001" in text  # the rate of the trainer's last step
    assert "ETA 14m" in text and "trainer pid 4242, attempt 3" in text
    # ages in seconds tick on while the test runs (a loaded machine takes more than 0.5 s): the unit, not the digit
    assert "local checkpoint: step 1000 (2m ago)" in text
    assert re.search(r"remote: step 1000 \(6\ds ago, verified\)", text), text
    assert "restarts: 1 (last: sigbus at step 800" in text and "-> restage" in text
    assert "train.micro_batch_size" in text


def test_status_when_the_supervisor_died_without_an_outcome(tmp_path):
    run_dir = write_run(tmp_path, phase="training", supervisor={"pid": 999999, "start_ticks": 1,  # this host's
                                                                 "host": socket.gethostname(), "started": 0})
    rc, text = status_text(run_dir)
    assert rc == 0 and "not running (last seen" in text and "did not exit cleanly" in text
    assert "trainer pid" not in text


def test_status_of_a_finished_run_and_a_stalled_sync(tmp_path):
    t = time.time()
    run_dir = write_run(tmp_path, phase="done", supervisor={"pid": 999999, "start_ticks": 1},
                        outcome={"exit": 0, "time": t, "phase": "done", "reason": "x"},
                        sync={"state": "stalled", "error": "sync running for 300s", "since": t, "attempts": 3},
                        last_error="sync failed: OSError: [Errno 5] Input/output error")
    rc, text = status_text(run_dir)
    assert "not running (ended" in text and "exit 0" in text
    # its supervisor gone: the stalled sync is no longer waited on (fault10 F3), its error still said
    assert "sync: interrupted (was stalled at " in text, text
    assert ": sync running for 300s; `minilmd run` syncs again)" in text, text
    assert "last error: sync failed: OSError" in text
    rc, raw = status_text(run_dir, as_json=True)
    doc = json.loads(raw)
    assert doc["running"] is False and doc["state"]["phase"] == "done"


def test_status_while_waiting_for_a_gpu_names_the_busy_devices(tmp_path):
    t = time.time()
    run_dir = write_run(tmp_path, phase="waiting_gpu", gpu_wait={"since": t - 100, "devices": [
        {"index": 0, "free": False, "reasons": ["1 foreign process: pid 77 (49500 MiB)"], "since": t - 100},
        {"index": 1, "free": True, "reasons": [], "since": t - 5}]})
    _, text = status_text(run_dir)
    assert "GPU 0: 1 foreign process: pid 77 (49500 MiB)" in text and "GPU 1: free" in text


def test_not_a_run_and_a_run_without_state(tmp_path):
    rc, _ = status_text(tmp_path)
    assert rc == 2
    assert views_stop.stop(tmp_path / "missing", out=io.StringIO()) == 2
    (tmp_path / "run.toml").write_text("")
    rc, text = status_text(tmp_path)
    assert rc == 0 and "no state.json yet" in text


def test_stop_on_a_run_that_is_not_running(tmp_path):
    run_dir = write_run(tmp_path, phase="done", supervisor={"pid": 999999, "start_ticks": 1},
                        outcome={"exit": 0, "time": time.time(), "reason": "the run finished"})
    out = io.StringIO()
    assert views_stop.stop(run_dir, out=out) == 0
    assert "not running" in out.getvalue() and "the run finished" in out.getvalue()


def test_logs_shows_the_supervisor_log_and_the_newest_attempt(tmp_path):
    run_dir = write_run(tmp_path)
    (run_dir / "supervisor.log").write_text("line one\nline two\n")
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "attempt-0001.log").write_text("old attempt\n")
    (run_dir / "logs" / "attempt-0002.log").write_text("new attempt\n")
    out = io.StringIO()
    assert views.logs(run_dir, out=out) == 0
    text = out.getvalue()
    assert "line two" in text and "new attempt" in text and "old attempt" not in text


def test_status_tells_an_old_error_from_a_current_one(tmp_path):
    t = time.time()
    progress = {"step": 240, "total_steps": 240, "heartbeat": t}
    old = write_run(tmp_path, phase="done", progress=progress, last_error="sigbus: killed by SIGBUS",
                    last_error_at=t - 180, last_error_step=130)
    _, text = status_text(old)
    assert "last error (3m ago, at step 130; training went on to step 240): sigbus" in text
    current = write_run(tmp_path, phase="backoff", progress=dict(progress, step=130), last_error="hang: no heartbeat",
                        last_error_at=t - 5, last_error_step=130)
    _, text = status_text(current)
    assert re.search(r"last error \(\d+s ago, at step 130\): hang", text) and "went on" not in text, text
