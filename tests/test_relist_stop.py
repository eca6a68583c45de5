"""A stop during staging's re-list (daemon/jobs/stagingfetch.py `_list_again`) after its first fetch put the
remote's older step in scratch (review12a F1): a real supervisor and the fake trainer. Before, the last sync pushed
that older step: the remote's LATEST moved back to it, state.json's remote step was rewritten to it, and the next
start with an empty scratch resumed from it with no note of the steps trained again. Now the last sync pushes
nothing (no trainer ran, and scratch's newest is what this start fetched: daemon/jobs/lastsyncrule.py), the record
stays, and the next start lists again and says which steps are trained again."""
from __future__ import annotations

import shutil

import pytest

from minilmd import names
from reliability_helpers import event_texts
from supervisor_helpers import (
    cli,
    run_supervisor,
    start_supervisor,
    state,
    synced_steps_10_and_20,
    wait_for,
    wait_or_kill,
)


@pytest.mark.slow  # three supervised runs of the fake trainer, a stopped start between them
def test_a_stop_during_the_relist_pushes_nothing_and_the_next_start_says_what_is_trained_again(tmp_path, corpus):
    config, cfg, remote = synced_steps_10_and_20(tmp_path, corpus, then=30)
    assert state(cfg.run_dir)["remote_checkpoint"]["step"] == 20
    shutil.rmtree(remote / names.step_name(20))  # removed by hand: the remote lists step 10 only
    shutil.rmtree(cfg.scratch_dir)  # a reboot emptied scratch
    out = tmp_path / "stopped.out"
    supervisor = start_supervisor(config, out)
    try:
        wait_for(lambda: "listing it again" in out.read_text(), 180, "the re-list's pause")
        assert cli("stop", str(cfg.run_dir), timeout=120).returncode == 0
        assert wait_or_kill(supervisor, 120) == 0, out.read_text()[-3000:]
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    assert (remote / names.LATEST).read_text().strip() == names.step_name(20), out.read_text()[-3000:]
    assert state(cfg.run_dir)["remote_checkpoint"]["step"] == 20
    pushed = [m for m in event_texts(cfg.run_dir, "sync") if "the last sync pushes nothing" in m]
    assert pushed and "step 10, is the one this start fetched from" in pushed[-1], event_texts(cfg.run_dir, "sync")
    shutil.rmtree(cfg.scratch_dir)
    # its re-list's pause waited out, not stopped in (tests/quick_cli.py; 5 s in use, kept above, where it is stopped)
    assert run_supervisor(config, tmp_path, quick={"TEST_RELIST_AFTER_S": "0.2"}) == 0, \
        (tmp_path / "supervisor.out").read_text()[-3000:]
    notes = event_texts(cfg.run_dir, "note")
    assert any("resuming from step 10, which verifies: steps 11-20 are trained again" in m for m in notes), notes
    assert state(cfg.run_dir)["remote_checkpoint"]["step"] == 30
