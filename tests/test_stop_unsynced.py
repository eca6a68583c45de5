"""`minilmd stop` says so, with its own exit status (protocol.STOP_UNSYNCED), when the newest checkpoint is only in
scratch: the last sync failed (or a trainer saved with no supervisor left to sync it). A stop whose checkpoint is
safe on the remote, or a run without a remote, still exits 0. The runbook and docs/failure-modes.md list every
exit status of `minilmd stop`."""
from __future__ import annotations

import io
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from minilmd import names, protocol, run_owner
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.views import stop as views_stop
from minilmd.fsio import atomic_write_json
from supervisor_helpers import cli, start_supervisor, state, wait_for, wait_or_kill, write_config

REPO = Path(__file__).resolve().parent.parent


def ended_run(tmp_path: Path, local_step: int | None, remote_step: int | None, sync: str = "failed",
              saved: tuple[int, ...] = ()) -> Path:
    """A run whose supervisor is gone, as `_finish` leaves it after a stop; `saved` are the checkpoint
    directories in scratch."""
    run_dir, root = tmp_path / "run", tmp_path / "scratch" / names.CHECKPOINTS
    run_dir.mkdir()
    root.mkdir(parents=True)
    for step in saved:
        (root / names.step_name(step)).mkdir()
        (root / names.step_name(step) / names.MANIFEST).write_text("{}")
    st = new_state("r", run_dir, str(tmp_path / "r.toml"))
    st.update(phase="done", supervisor={"pid": 999999, "start_ticks": 1, "host": "h"},
              sync={"state": sync, "since": time.time(), "error": "OSError: [Errno 5] EIO" if sync == "failed"
                    else None, "attempts": 3},
              local_checkpoint=None if local_step is None else
              {"step": local_step, "time": time.time(), "path": str(root / names.step_name(local_step))},
              remote_checkpoint=None if remote_step is None else
              {"step": remote_step, "time": time.time(), "verified": True, "path": "remote"},
              outcome={"exit": 0, "phase": "done", "time": time.time(), "reason": "stopped on request"})
    atomic_write_json(run_dir / names.STATE, st)
    return run_dir


def stopped(run_dir: Path) -> tuple[int, str]:
    out = io.StringIO()
    return views_stop.stop(run_dir, out=out), out.getvalue()


def test_the_newest_checkpoint_only_in_scratch_is_exit_3_with_its_path(tmp_path):
    rc, text = stopped(ended_run(tmp_path, 40, 20, saved=(20, 40)))
    assert rc == protocol.STOP_UNSYNCED == 3
    path = tmp_path / "scratch" / names.CHECKPOINTS / names.step_name(40)
    assert f"NOT SYNCED (exit 3): the newest checkpoint, step 40, is only in scratch: {path}" in text, text
    assert "the remote has step 20 (last sync error: OSError: [Errno 5] EIO)" in text


def test_a_save_state_json_has_not_seen_counts_too(tmp_path):
    """An orphaned trainer stopped by `stop` saves on SIGTERM, with no supervisor to sync it or to note it."""
    rc, text = stopped(ended_run(tmp_path, 20, 20, sync="ok", saved=(20, 30)))
    assert rc == protocol.STOP_UNSYNCED and f"step 30, is only in scratch: {tmp_path / 'scratch'}" in text, text


@pytest.mark.parametrize("local, remote, sync", [(40, 40, "failed"), (40, None, "off"), (None, None, "idle")])
def test_a_checkpoint_on_the_remote_or_no_remote_is_exit_0(tmp_path, local, remote, sync):
    rc, text = stopped(ended_run(tmp_path, local, remote, sync=sync, saved=(local,) if local else ()))
    assert rc == protocol.STOP_DONE and "NOT SYNCED" not in text, text


@pytest.mark.slow
def test_stop_after_the_remote_broke_exits_3_and_says_where_the_checkpoint_is(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 100000, "checkpoint_every": 20})
    cfg = load_config(config)
    sup = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.02")
    try:
        synced = wait_for(lambda: (state(cfg.run_dir).get("remote_checkpoint") or {}).get("step"), 60,
                          "a first sync")
        remote = Path(cfg.run.remote)
        shutil.move(remote, tmp_path / "remote-away")
        remote.write_text("not a directory any more\n")  # every later sync fails, root or not
        wait_for(lambda: (state(cfg.run_dir).get("sync") or {}).get("state") == "failed", 60, "a failed sync")
        out = cli("stop", str(cfg.run_dir), timeout=200)
        assert out.returncode == protocol.STOP_UNSYNCED, out.stdout + out.stderr
        wait_or_kill(sup, 60)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    newest = max(names.step_of(p) for p in cfg.checkpoint_dir.iterdir() if names.is_step_name(p.name))
    assert newest > synced
    assert f"step {newest}, is only in scratch: {cfg.checkpoint_dir / names.step_name(newest)}" in out.stdout, \
        out.stdout
    assert f"the remote has step {synced}" in out.stdout


STOP_TABLE = re.compile(r"`minilmd stop`[^\n]*\n\n((?:\|[^\n]*\n)+)")


@pytest.mark.parametrize("doc", ["docs/operations.md", "docs/failure-modes.md"])
def test_both_docs_list_every_exit_status_of_stop(doc):
    text = (REPO / doc).read_text(encoding="utf-8")
    section = re.search(r"^## Exit statuses\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, f"{doc}: no '## Exit statuses'"
    table = STOP_TABLE.search(section.group(1))
    assert table, f"{doc}: no table after a line naming `minilmd stop` in its Exit statuses"
    rows = {int(s) for s in re.findall(r"^\| (\d+) \|", table.group(1), re.M)}
    statuses = {getattr(protocol, n) for n in dir(protocol) if n.startswith("STOP_")}
    assert rows == statuses, f"{doc}: rows {sorted(rows)}, protocol.STOP_*: {sorted(statuses)}"


def remote_with(tmp_path: Path, latest: int, owner: int | None = None) -> Path:
    """A run.remote of the run in tmp_path/run whose LATEST names step `latest` (its directory with a manifest),
    `owner` its LATEST's."""
    remote = tmp_path / "remote"
    (remote / names.step_name(latest)).mkdir(parents=True)
    (remote / names.step_name(latest) / names.MANIFEST).write_text("{}")
    (remote / names.LATEST).write_text(names.step_name(latest) + "\n")
    (remote / names.REMOTE_OWNER).write_bytes(run_owner.encode(run_owner.record(tmp_path / "run", "r")))  # its claim
    if owner is not None:
        os.chown(remote / names.LATEST, owner, owner)
    return remote


def recorded_remote(run_dir: Path, remote: Path, step: int) -> None:
    st = state(run_dir)
    st["remote_checkpoint"]["path"] = str(remote / names.step_name(step))
    atomic_write_json(run_dir / names.STATE, st)


def test_a_scratch_checkpoint_gone_is_no_checkpoint_only_in_scratch(tmp_path):
    """After a reboot (reports fault8 F2): state.json names step 100 in a scratch cleared since; the remote's older
    record is no reason for exit 3, and the line says no local checkpoint, not a path that does not exist."""
    run_dir = ended_run(tmp_path, 100, 50)  # nothing saved in scratch
    rc, text = stopped(run_dir)
    assert rc == protocol.STOP_DONE and "NOT SYNCED" not in text, text


@pytest.mark.parametrize("owner, rc", [(None, protocol.STOP_DONE), (64123, protocol.STOP_UNSYNCED)])
def test_the_remotes_latest_newer_than_the_record_is_the_remotes_step(tmp_path, owner, rc):
    """A supervisor killed after its sync put step 100 in place, before its state.json said so: the remote has it
    (its LATEST, the run's user's); a LATEST of another user proves nothing: exit 3 as before."""
    run_dir = ended_run(tmp_path, 100, 50, saved=(100,))
    recorded_remote(run_dir, remote_with(tmp_path, 100, owner), 50)
    got, text = stopped(run_dir)
    assert got == rc, text
    assert ("NOT SYNCED" in text) == (rc == protocol.STOP_UNSYNCED), text
