"""A team run.remote (group-writable, not sticky) whose owner.json a teammate replaces while the run trains: before,
every sync after it was refused and the run ended `failed` (exit 1), its last checkpoint unsynced. Now a remote
whose owner record is no longer this run's is a remote out of reach with its reason said: training goes on, the
checkpoints stay in scratch, the sync is retried and never writes there; status and events.jsonl name the record's
owner and the way out; the run ends `done`, how it ended `unsynced` (its last checkpoint only in scratch, which is
kept). Run by the victim (root) against a real second user, `nobody`, in the team's group."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from minilmd import names, run_owner
from minilmd.init_source import Predecessor, predecessor_report
from minilmd.protocol import ENDED_UNSYNCED, how_ended, restart_may_follow
from second_user import as_user, group_dir, teammate  # noqa: F401 - the fixture
from supervisor_helpers import (
    cli,
    events,
    run_supervisor,
    start_supervisor,
    state,
    wait_for,
    wait_or_kill,
    write_config,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPLACE = 'rm -f "$1" && cat > "$1"'
"""What the teammate does: her owner.json unlinked (a non-sticky directory his group writes), his own in its place."""


def _replace_claim(remote: Path, run_dir: Path) -> None:
    record = run_owner.encode(run_owner.record(run_dir, "s"))  # even one naming her run: his file is no claim of hers
    done = subprocess.run(as_user(["sh", "-c", REPLACE, "sh", str(remote / names.REMOTE_OWNER)]), input=record,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _remote_step(run_dir: Path) -> int:
    return (state(run_dir).get("remote_checkpoint") or {}).get("step") or 0


def test_a_replaced_owner_record_ends_the_run_unsynced_not_failed(teammate, tmp_path, corpus):
    (uid, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote)})
    run_dir, release = tmp_path / "s" / "run", tmp_path / "release"
    proc = start_supervisor(config, tmp_path / "supervisor.out", FAKE_HOLD=f"15:{release}")
    try:
        wait_for(lambda: _remote_step(run_dir) == 10, timeout=120, what="step 10 synced")
        _replace_claim(remote, run_dir)
        release.touch()  # steps 20 and 30 are saved and their syncs refused
        assert wait_or_kill(proc, timeout=180) == 0
    finally:
        release.touch()
        wait_or_kill(proc, timeout=180)
    final = state(run_dir)
    assert final["phase"] == "done" and how_ended(final) == ENDED_UNSYNCED, final
    assert not restart_may_follow(final)
    waits = predecessor_report(Predecessor("s", run_dir, config))  # a stage after it: no start from step 10's remote
    assert waits.outcome == "waiting" and "not on its run.remote" in waits.why, waits
    assert "not synced" in final["reason"] and f"uid {uid}" in final["reason"], final["reason"]
    said = [e["message"] for e in events(run_dir)]
    assert any("owner.json" in m and f"uid {uid}" in m and "nothing is written to the remote" in m for m in said), said
    assert any(m.startswith("kept ") for m in said), said  # scratch kept: the last checkpoint's only copy
    assert _remote_step(run_dir) == 10
    assert not (remote / names.step_name(30)).exists()  # never written into once the record was his
    assert (remote / names.REMOTE_OWNER).stat().st_uid == uid
    assert (tmp_path / "s" / "scratch" / "checkpoints" / names.step_name(30)).is_dir()  # kept in scratch
    shown = cli("status", str(config)).stdout
    assert "unsynced" in shown and "owner.json" in shown and f"uid {uid}" in shown, shown  # whose, and the way out
    # the way out the reason gives: the record's owner removes his file, the run is started again and syncs its last
    done = subprocess.run(as_user(["rm", str(remote / names.REMOTE_OWNER)]), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert run_supervisor(config, tmp_path, timeout=180) == 0
    again = state(run_dir)
    assert how_ended(again) == "finished" and _remote_step(run_dir) == 30, again
    assert (remote / names.step_name(30)).is_dir()
