"""state.json's typed sections (daemon/base/statesections.py): written with the keys it has always had, read tolerantly:
a field of the wrong type or a missing one is its default, in the supervisor and in `minilmd status`."""
from __future__ import annotations

import io
import json
import time
from pathlib import Path

from minilmd import names
from minilmd.daemon.base.runstate import RunState, new_state
from minilmd.daemon.base.statesections import LocalCheckpoint, Restart, StateJson
from minilmd.daemon.views import status as views
from minilmd.fsio import atomic_write_json

DAMAGED = {"phase": 3, "since": "yesterday", "supervisor": [1, 2], "progress": {"step": "12", "loss": None,
           "total_steps": 30}, "sync": "ok", "staging": {"state": 7}, "restarts": [5, {"cause": "oom", "time": "x"}],
           "overrides": ["train.lr"], "child": {"pid": "4242"}, "local_checkpoint": {"step": 10, "time": "now"},
           "remote_checkpoint": 17, "outcome": "done", "no_progress_streak": True, "last_error": 42}


def test_a_new_state_is_written_back_key_for_key_and_the_optional_keys_appear_once_set(tmp_path):
    fresh = new_state("r", tmp_path, "r.toml")
    st = RunState(tmp_path / names.STATE, fresh)
    assert json.loads(json.dumps(st.data)) == json.loads(json.dumps(fresh))
    assert "progress" not in st.data["staging"] and "last_ok" not in st.data["sync"] and "slurm" not in st.data
    st.staging.state = "running"
    st.local_checkpoint = LocalCheckpoint(step=4, time=1.0, path="p", blocking_s=0.5)
    st.restarts.append(Restart(time=2.0, attempt=1, cause="oom", exit=1, step=4, detail="d", action="restart",
                               delay_s=0.1))
    st.save()
    written = json.loads((tmp_path / names.STATE).read_text())
    assert written["staging"]["progress"] is None and "finished" not in written["staging"]
    assert written["local_checkpoint"] == {"step": 4, "time": 1.0, "path": "p", "blocking_s": 0.5}
    assert set(written["restarts"][0]) == {"time", "attempt", "cause", "exit", "step", "detail", "action", "delay_s"}
    assert "previous_child" not in written
    st.adopt(written, None)
    assert "previous_child" in st.data and st.data["previous_child"] is None  # the previous one ran no trainer


def test_wrongly_typed_fields_read_as_their_defaults():
    state = StateJson.from_dict(DAMAGED)
    assert state.phase == "" and state.since is None and state.supervisor.pid is None
    assert state.progress.step is None and state.progress.total_steps == 30 and state.sync.state == "off"
    assert state.staging.state == "not_started" and state.overrides == {} and state.child is not None
    assert state.child.pid is None and state.remote_checkpoint is None and state.outcome is None
    assert [r.cause for r in state.restarts] == ["oom"] and state.restarts[0].time is None
    assert state.no_progress_streak == 0 and state.last_error is None
    assert StateJson.from_dict("not a dict") == StateJson()


def test_status_and_the_supervisor_read_a_damaged_state_json_without_a_traceback(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    atomic_write_json(run_dir / names.STATE, DAMAGED)
    out = io.StringIO()
    assert views.status(run_dir, out=out) == 0
    text = out.getvalue()
    # no supervisor holds the run: "not running", never "training for"; a step that is not a number is not shown
    assert text.startswith("run ? (?): not running") and "restarts: 1 (last: oom, - -> " in text
    st = RunState(run_dir / names.STATE, new_state("r", run_dir, "r.toml"))
    st.adopt(json.loads((run_dir / names.STATE).read_text()), None)
    assert st.overrides == {} and st.remote_checkpoint is None and st.no_progress_streak == 0
    assert len(st.restarts) == 1 and st.restarts[0].cause == "oom"
    st.save()
    assert json.loads((run_dir / names.STATE).read_text())["run"] == "r"


def test_status_of_a_live_run_reads_the_same_through_the_sections(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    t = time.time()
    state = new_state("demo", run_dir, str(tmp_path / "demo.toml"))
    state.update(phase="waiting_space", since=t - 30,
                 space_wait={"since": t - 30, "needs": 3_000_000, "free": 1_000_000, "path": "/scratch", "checks": 4})
    atomic_write_json(Path(run_dir) / names.STATE, state)
    out = io.StringIO()
    views.status(run_dir, out=out)
    assert "a checkpoint needs 3.0 MB, 1.0 MB free in /scratch; checked 4 times" in out.getvalue()


def test_a_start_after_the_runs_end_counts_restarts_anew_and_keeps_the_runs_count(tmp_path):
    """restart.max_restarts counts the restarts since the start after the run's last end: a supervisor that ended
    (its outcome written) leaves its restarts to earlier_restarts, summed over every such end; one killed or crashed
    (no outcome) passes its count and its start's time on."""
    def ended_with(restarts: int, earlier: int, outcome: bool) -> dict:
        old = RunState(tmp_path / names.STATE, new_state("r", tmp_path, "r.toml"))
        old.restarts = [Restart(time=1.0, attempt=n, cause="crash", action="restart") for n in range(restarts)]
        old.earlier_restarts, old.restarts_since = earlier, 5.0
        data = old.data
        data["outcome"] = {"exit": 0, "phase": "done", "time": 9.0, "reason": "stopped on request"} if outcome \
            else None
        return data

    after_end = RunState(tmp_path / names.STATE, new_state("r", tmp_path, "r.toml"))
    after_end.adopt(ended_with(2, 1, outcome=True), None)
    assert (len(after_end.restarts), after_end.earlier_restarts) == (0, 3)
    assert after_end.restarts_since == after_end.supervisor.started and after_end.no_progress_streak == 0
    after_crash = RunState(tmp_path / names.STATE, new_state("r", tmp_path, "r.toml"))
    after_crash.adopt(ended_with(2, 1, outcome=False), None)
    assert (len(after_crash.restarts), after_crash.earlier_restarts, after_crash.restarts_since) == (2, 1, 5.0)
    out = io.StringIO()
    after_end.save()
    views.status(tmp_path, out=out)
    assert "  restarts: 0 since the start at " in out.getvalue() and " (3 since the run began)" in out.getvalue()
