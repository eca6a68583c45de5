"""A long refusal is said once by `status` and `stop` (daemon/views/saidonce.py). A new user's run whose syncs were
refused by run.remote's owner record showed its ~1,100-character refusal three times in `status` (why, sync, last
error) and as often in `stop`'s output: now where it is first shown, the other lines saying "said above" (`minilmd
logs` has every line whole). And `stop` after a final end (run.remote another run's, exit 2) no longer advises
copying the checkpoint into run.remote by hand."""
from __future__ import annotations

import io
import time
from pathlib import Path

from minilmd import names, protocol
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.views import stop as views_stop
from minilmd.daemon.views.saidonce import SAID, fold
from minilmd.daemon.views.status import summary_lines
from minilmd.fsio import atomic_write_json
from minilmd.protocol import FINAL_SYNC_WAITING

REFUSED = ("sync to /nfs/race refused: run.remote /nfs/race: /nfs/race/owner.json is another user's file (owned by "
           "uid 4242), not this run's claim; it was not read: the run neither syncs there nor resumes from there "
           "while it stands (a claim no sync of this user wrote); have its owner remove it, or give run.remote a "
           "directory of this run's own")


def test_status_of_a_last_sync_waiting_for_the_claim_says_the_refusal_once():
    now = time.time()
    shown = "\n".join(summary_lines(StateJson.from_dict({
        "phase": "stopping", "reason": f"{FINAL_SYNC_WAITING}{REFUSED}", "since": now,
        "sync": {"state": "failed", "error": REFUSED, "since": now, "attempts": 4},
        "last_error": f"sync failed: {REFUSED}", "last_error_at": now}), alive=True, t=now))
    assert shown.count("owned by uid 4242") == 1, shown
    assert f"why: {FINAL_SYNC_WAITING}sync to /nfs/race refused" in shown, shown
    assert "sync: failed (said above)" in shown and "last error (0s ago): sync failed: said above" in shown, shown


def test_a_short_error_is_said_again_and_a_new_one_whole():
    assert fold("sync failed: OSError: [Errno 5] EIO", "why: remote full, OSError: [Errno 5] EIO", ()) == \
        "sync failed: OSError: [Errno 5] EIO"  # too short to point back to
    assert fold(f"stopped, but {REFUSED}; kept", REFUSED, (REFUSED,)) == f"stopped, but {SAID}; kept"
    assert fold(REFUSED, "another reason", (REFUSED,)) == REFUSED


def _ended(tmp_path: Path, exit_status: int, reason: str, sync_error: str, last_error: str) -> Path:
    """A run ended with its newest checkpoint, step 40, only in scratch and step 20 on run.remote."""
    run_dir, root = tmp_path / "run", tmp_path / "scratch" / names.CHECKPOINTS
    run_dir.mkdir()
    for step in (20, 40):
        (root / names.step_name(step)).mkdir(parents=True)
        (root / names.step_name(step) / names.MANIFEST).write_text("{}")
    st = new_state("r", run_dir, str(tmp_path / "r.toml"))
    phase = "done" if exit_status == 0 else "failed"
    st.update(phase=phase, reason=reason, supervisor={"pid": 999999, "start_ticks": 1, "host": "h"},
              sync={"state": "failed", "since": time.time(), "error": sync_error, "attempts": 3},
              local_checkpoint={"step": 40, "time": time.time(), "path": str(root / names.step_name(40))},
              remote_checkpoint={"step": 20, "time": time.time(), "verified": True, "path": "remote"},
              last_error=last_error, last_error_at=time.time(),
              outcome={"exit": exit_status, "phase": phase, "time": time.time(), "reason": reason})
    atomic_write_json(run_dir / names.STATE, st)
    return run_dir


def _stop(run_dir: Path) -> tuple[int, str]:
    out = io.StringIO()
    return views_stop.stop(run_dir, out=out), out.getvalue()


def test_stop_of_a_run_stopped_while_its_last_sync_waited_says_the_refusal_once(tmp_path):
    reason = f"stopped on request (the last sync was refused: {REFUSED})"
    rc, text = _stop(_ended(tmp_path, 0, reason, REFUSED, f"stopped, but the last sync was refused: {REFUSED}"))
    assert rc == protocol.STOP_UNSYNCED and text.count("owned by uid 4242") == 1, text
    assert "(last sync error: said above)" in text, text
    assert "copy that directory into run.remote by hand" in text  # a remote of its own: still a way


def test_stop_after_the_final_end_on_another_runs_remote_advises_no_copy_into_it(tmp_path):
    refused = "run.remote /nfs/race belongs to another run, the run directory /home/u/a/run (run.name 'a', ...)"
    reason = f"config error, final: {refused}; its newest checkpoint, step 40, stays in ...: set run.remote to a " \
             f"directory of this run's own, then `minilmd run /home/u/b.toml` again"
    rc, text = _stop(_ended(tmp_path, protocol.SUPERVISOR_CONFIG, reason, refused, reason))
    assert rc == protocol.STOP_UNSYNCED and text.count("belongs to another run") == 1, text
    assert "into run.remote by hand" not in text and "do what its end says, then start the run again" in text, text
