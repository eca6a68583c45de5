"""`minilmd stop` takes the remote's LATEST as this run's newest synced step only while the remote's owner.json names
this run (review10d F5): a remote another run of the user claimed since has that run's LATEST, and counting it made
`stop` say "synced" while this run's newest checkpoint was only in scratch."""
from __future__ import annotations

from pathlib import Path

from minilmd import names, run_owner
from minilmd.daemon.base.statesections import RemoteCheckpoint
from minilmd.daemon.views.stop import _remote_step


def remote_with_latest(tmp_path: Path, owner_run: Path) -> Path:
    remote = tmp_path / "remote"
    for step in (50, 100):
        (remote / names.step_name(step)).mkdir(parents=True)
        (remote / names.step_name(step) / names.MANIFEST).write_text("{}")
    (remote / names.LATEST).write_text(names.step_name(100) + "\n")
    (remote / names.REMOTE_OWNER).write_bytes(run_owner.encode(run_owner.record(owner_run, "r")))
    return remote


def test_the_remotes_latest_counts_only_while_its_owner_record_names_this_run(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    remote = remote_with_latest(tmp_path, theirs)  # taken over by `run --claim-remote` of another run
    recorded = RemoteCheckpoint(step=50, path=str(remote / names.step_name(50)))
    assert _remote_step(recorded, ours) == 50
    (remote / names.REMOTE_OWNER).write_bytes(run_owner.encode(run_owner.record(ours, "r")))
    assert _remote_step(recorded, ours) == 100  # its own LATEST, newer than state.json's record: counted as before


def test_a_remote_without_an_owner_record_is_state_jsons_word(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir()
    remote = remote_with_latest(tmp_path, ours)
    (remote / names.REMOTE_OWNER).unlink()
    assert _remote_step(RemoteCheckpoint(step=50, path=str(remote / names.step_name(50))), ours) == 50
