"""`status` during a restart (staging, a fetch, a compile) shows the step and total of the trainer before it as
"last known", not as the run's progress (user9 F11: `step 753/3,000` while staging a run whose config now says 900
and that resumed from the remote's 715); once the restarted trainer beats, its step is shown as before."""
from __future__ import annotations

import io

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.base.statesections import Progress
from minilmd.daemon.views.status import _progress_lines, status
from minilmd.fsio import atomic_write_json
from supervisor_helpers import logged_run


def test_the_step_before_a_restart_is_said_as_last_known_until_the_new_trainer_beats():
    before = Progress(step=753, total_steps=3_000, heartbeat=90.0, rates_awaited_since=100.0)
    [line] = _progress_lines(before, alive=True)
    assert line.startswith("  last known step 753 (of 3,000 then)"), line
    beaten = Progress(step=715, total_steps=3_000, heartbeat=110.0, rates_awaited_since=100.0)  # resumed at 715
    [line] = _progress_lines(beaten, alive=True)
    assert line.startswith("  step 715/3,000 (23.8%)"), line
    logged = Progress(step=720, total_steps=900, heartbeat=90.0)  # a train line: rates no longer awaited
    assert _progress_lines(logged, alive=True)[0].startswith("  step 720/900 (80.0%)")


def test_a_run_waiting_for_its_remote_shows_that_wait_as_why_and_the_sparkline_under_the_step(tmp_path):
    """Found by a new user: during `staging: waiting_remote` status put the loss sparkline above the why line (it
    goes under the step line, and the step line read "last known step"), and the why was the GPU admission's
    ("train.device = cpu: no GPU needed"), how staging began, not why the run waits."""
    run_dir = logged_run(tmp_path, 20)
    state = new_state("r", run_dir, str(tmp_path / "r.toml"))
    state.update(phase="staging", reason="train.device = cpu: no GPU needed",
                 staging={"state": "waiting_remote", "error": "remote unavailable: [Errno 2] No such file"},
                 progress={"step": 20, "total_steps": 3000, "heartbeat": 90.0, "rates_awaited_since": 100.0})
    atomic_write_json(run_dir / names.STATE, state)
    out = io.StringIO()
    assert status(run_dir, out=out) == 0
    lines = out.getvalue().splitlines()
    step = next(i for i, line in enumerate(lines) if line.startswith("  last known step 20 (of 3,000 then)"))
    assert lines[step + 1].startswith("  loss ") and " steps 1-20: " in lines[step + 1], lines
    [why] = [line for line in lines if line.startswith(("  why: ", "  last reason: "))]
    assert "waiting for run.remote's newest checkpoint" in why and "no GPU" not in why, lines


def test_a_run_whose_staging_waits_for_its_corpus_share_says_that_wait_as_why(tmp_path):
    """Found by a new user: with data.prepared's share gone, staging waits for it (the next line says so), and the
    why line still said the GPU admission's "train.device = cpu: no GPU needed"."""
    run_dir = logged_run(tmp_path, 20)
    state = new_state("r", run_dir, str(tmp_path / "r.toml"))
    state.update(phase="staging", reason="train.device = cpu: no GPU needed",
                 staging={"state": "running", "unreachable": "/mnt/share/prepared: no such directory",
                          "unreachable_since": 100.0, "waiting": "corpus source unreachable"})
    atomic_write_json(run_dir / names.STATE, state)
    out = io.StringIO()
    assert status(run_dir, out=out) == 0
    lines = out.getvalue().splitlines()
    [why] = [line for line in lines if line.startswith(("  why: ", "  last reason: "))]
    assert "corpus source unreachable" in why and "no GPU" not in why, lines


def test_a_remote_the_supervisor_knows_does_not_answer_is_said_so_beside_its_last_sync(tmp_path):
    """Found by a new user: with run.remote moved away, `status` said `remote: step 241 (39s ago, verified)` and
    `status --all` `SYNC 39s ago`, as if it were there. Where the supervisor knows it does not answer (the last sync
    found its root gone: `remote unavailable: ...`; the fetch could not read it: `unavailable`), both say so."""
    from minilmd.daemon.base.statesections import StateJson
    from minilmd.daemon.views.overview import _cells
    from minilmd.daemon.views.remotenow import remote_words

    t = 1_000.0
    state = StateJson.from_dict({"remote_checkpoint": {"step": 241, "time": t - 39, "verified": True},
                                 "sync": {"state": "failed", "since": t - 5, "error": "remote unavailable: "
                                          "run.remote /mnt/share/ckpt is not there (a share not mounted?)"}})
    words = remote_words(state, t, True, None)
    assert words.startswith("step 241 (verified 39s ago; run.remote does not answer now since "), words
    full = StateJson.from_dict({**state.to_dict(), "sync": {"state": "failed", "error": "remote full (needs 2 MB)"}})
    assert remote_words(full, t, True, None) == "step 241 (39s ago, verified)"  # it answered: full
    row = {"run": "r", "run_dir": "/x", "phase": "staging", "running": True, "sync_state": "failed",
           "last_sync_age_s": 39.0, "remote_unanswered": True}
    assert "39s ago (failed: remote not answering)" in _cells(row)


def test_a_run_whose_staging_reads_stall_says_that_wait_as_why(tmp_path):
    """staging.stalled (a source whose reads block: a hung share) is the why as well, not the GPU admission's words
    (views/status.py phase_reason, its branch for a source that does not answer)."""
    run_dir = logged_run(tmp_path, 20)
    state = new_state("r", run_dir, str(tmp_path / "r.toml"))
    state.update(phase="staging", reason="train.device = cpu: no GPU needed",
                 staging={"state": "running", "stalled": {"what": "init.from /mnt/share/base", "since": 100.0}})
    atomic_write_json(run_dir / names.STATE, state)
    out = io.StringIO()
    assert status(run_dir, out=out) == 0
    lines = out.getvalue().splitlines()
    [why] = [line for line in lines if line.startswith(("  why: ", "  last reason: "))]
    assert "waiting for init.from /mnt/share/base, which does not answer" in why and "no GPU" not in why, lines


def test_which_sync_states_say_the_remote_does_not_answer_now():
    """run_states.remote_unanswered: the fetch could not read it, a sync blocks on it, or the last sync found it gone
    (its error REMOTE_UNAVAILABLE's); a sync that failed with an answer (a full remote), or none, is not."""
    from minilmd.run_states import REMOTE_UNAVAILABLE, SyncState, remote_unanswered

    gone = f"{REMOTE_UNAVAILABLE}: run.remote /mnt/share/ckpt is not there (a share not mounted?)"
    assert remote_unanswered(SyncState.UNAVAILABLE, None) and remote_unanswered(SyncState.STALLED, "no byte for 130s")
    assert remote_unanswered(SyncState.FAILED, gone)
    assert not remote_unanswered(SyncState.FAILED, "remote full (needs 2 MB)")
    assert not remote_unanswered(SyncState.FAILED, None) and not remote_unanswered(SyncState.IDLE, gone)


def test_the_trainer_line_never_gives_a_new_trainer_the_heartbeat_of_the_one_before_it():
    """Found by a new user: 7 s after a SIGKILL of the trainer, status said `starting for 7s` and `trainer pid 7899,
    attempt 3, ... heartbeat 13s ago`: the heartbeat was attempt 2's, older than attempt 3 itself."""
    from minilmd.daemon.base.statesections import StateJson
    from minilmd.daemon.views.status import _trainer_line

    t = 1_000.0
    state = StateJson.from_dict({"child": {"pid": 7899, "attempt": 3, "started": t - 7, "log": "logs/a3.log"},
                                 "progress": {"step": 1344, "heartbeat": t - 13}})
    line = _trainer_line(state.child, state, t)
    assert "heartbeat none yet (the trainer before it beat last 13s ago)" in line, line
    beaten = StateJson.from_dict({**state.to_dict(), "progress": {"step": 1211, "heartbeat": t - 1}})
    assert "attempt 3, devices cpu, heartbeat 1s ago, log logs/a3.log" in _trainer_line(beaten.child, beaten, t)
