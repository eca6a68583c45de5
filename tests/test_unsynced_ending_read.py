"""A state.json an older minilmd ended `unsynced` (finished, exit 0, its last checkpoint only in scratch: run.remote's
owner.json was no longer its own) is still read as it was meant: `status` shows `unsynced`, a stage whose init.from
names it waits and says why, never starts from the older step its remote holds. (Now such a run's last sync waits
instead: tests/test_remote_claim_lost.py.)"""
from __future__ import annotations

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.views.overview import shown_phase
from minilmd.fsio import atomic_write_json
from minilmd.init_source import Predecessor, predecessor_report
from minilmd.protocol import ENDED_UNSYNCED, how_ended, restart_may_follow


def test_an_older_unsynced_ending_is_read_as_a_wait(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    body = new_state("s", run_dir, str(tmp_path / "s.toml"))
    body.update(phase="done", progress={"step": 30}, reason="the run finished, but its last checkpoint "
                "step-00000030 is not synced: ... owner.json is another user's file (owned by uid 4242) ...",
                outcome={"exit": 0, "phase": "done", "reason": "...", "ended": ENDED_UNSYNCED, "time": 1.0})
    atomic_write_json(run_dir / names.STATE, body)
    assert how_ended(body) == ENDED_UNSYNCED and not restart_may_follow(body)
    assert shown_phase({"phase": "done", "ended": how_ended(body)}) == "unsynced"
    report = predecessor_report(Predecessor("s", run_dir, tmp_path / "remote"))
    assert report.outcome == "waiting", report
    assert report.why == ("run s finished at step 30, but its last checkpoint is not on its run.remote (its "
                          "owner.json is not that run's): it is synced when that run is started again"), report.why
