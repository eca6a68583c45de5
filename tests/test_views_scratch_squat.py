"""After a reboot emptied /dev/shm, another user takes the name of the victim's private scratch root (it is listed in
/dev/shm, and in her start event) and plants a "newer" checkpoint there with a forged lineage (hostile audit 7 F1).
Before, `status` showed his step 99999 and his lineage, and `stop` exited 3 NOT SYNCED, telling her to copy his
directory into her remote by hand. The views now look only in a scratch still the run's (scratch_root.not_looked_in,
the rule of `sample/export RUN_DIR` too). The attacker is a real uid (64123, no passwd entry), the test root.
"""
from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.views import status as views
from minilmd.daemon.views import stop as views_stop
from minilmd.fsio import atomic_write_json

OTHER = 64123
UID = os.geteuid()


@pytest.fixture
def rebooted(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(run dir, the private root now his): a run that synced step 709 to its remote, its scratch in a private root
    run.dir records, emptied by a reboot and that name taken by another user holding a step 99999."""
    if UID != 0:
        pytest.skip("needs root to make another user's directory")
    base = tmp_path / "shm"
    base.mkdir()
    base.chmod(0o1777)
    monkeypatch.setenv(names.SCRATCH_BASE_ENV, str(base))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run_dir, remote, private = tmp_path / "run", tmp_path / "remote", base / f"minilmd-{UID}-h7qr5yl9"
    run_dir.mkdir()
    (remote / names.step_name(709)).mkdir(parents=True)
    (run_dir / names.RUN_CONFIG_COPY).write_text(
        f'[run]\nname = "r"\ndir = "{run_dir}"\nremote = "{remote}"\n[data]\nprepared = "{run_dir}"\n'
        f'[train]\nmax_steps = 1000\n')
    atomic_write_json(run_dir / names.SCRATCH_ROOT_RECORD, {"root": str(private), "because": "x", "since": 1.0})
    his = private / "r" / names.CHECKPOINTS / names.step_name(99999)  # what he planted after the reboot
    his.mkdir(parents=True)
    (his / names.MANIFEST).write_text('{"step": 99999}')
    (his / "trainer_state.json").write_text(json.dumps({"step": 99999, "init": {
        "kind": "checkpoint", "path": "/srv/team/official-base", "step": 5000, "manifest_sha256": "deadbeefcafe"}}))
    for where, dirs, files in os.walk(private):
        for name in [*dirs, *files]:
            os.chown(Path(where) / name, OTHER, OTHER)
    os.chown(private, OTHER, OTHER)
    t = time.time() - 60
    st = new_state("r", run_dir, str(run_dir / names.RUN_CONFIG_COPY))
    st.update(phase="stopped", since=t, updated=t, supervisor=None,
              local_checkpoint={"step": 709, "time": t, "path": str(private / "r" / names.CHECKPOINTS /
                                                                  names.step_name(709))},
              remote_checkpoint={"step": 709, "time": t, "path": str(remote / names.step_name(709)),
                                 "verified": True},
              sync={"state": "ok", "since": t, "error": None, "attempts": 1})
    atomic_write_json(run_dir / names.STATE, st)
    return run_dir, private


def test_status_and_stop_never_take_a_checkpoint_from_a_scratch_root_another_user_took(rebooted):
    run_dir, private = rebooted
    out = io.StringIO()
    assert views.status(run_dir, out=out) == 0
    text = out.getvalue()
    assert "99999" not in text and "official-base" not in text, text
    assert "local checkpoint: step 709" in text, text

    out = io.StringIO()
    assert views.status(run_dir, as_json=True, out=out) == 0
    assert "99999" not in out.getvalue(), out.getvalue()

    out = io.StringIO()
    assert views_stop.stop(run_dir, out=out) == 0, out.getvalue()  # her remote holds her newest step: synced
    assert "NOT SYNCED" not in out.getvalue() and str(private) not in out.getvalue(), out.getvalue()


def test_the_same_scratch_of_her_own_is_looked_in(rebooted):
    """The rule is whose the root is, not its name: her own root there, with an unsynced save, is said."""
    run_dir, private = rebooted
    for where, dirs, files in os.walk(private):
        for name in [*dirs, *files]:
            os.chown(Path(where) / name, UID, UID)
    os.chown(private, UID, UID)
    private.chmod(0o700)
    out = io.StringIO()
    assert views_stop.stop(run_dir, out=out) == 3
    assert "the newest checkpoint, step 99999, is only in scratch" in out.getvalue(), out.getvalue()


def test_roots_status_of_a_users_run_looks_in_her_own_scratch(tmp_path):
    """The rule is the run's user's, not the reader's: root's `status` of her run shows the save in her scratch
    that state.json has not seen (her directories are not "another user's" to it)."""
    if UID != 0:
        pytest.skip("needs root to read another user's run")
    run_dir, root = tmp_path / "run", tmp_path / "scratch" / names.CHECKPOINTS
    run_dir.mkdir()
    for step in (50, 250):  # 250: saved after state.json was last written (an orphaned trainer's save)
        (root / names.step_name(step)).mkdir(parents=True)
        (root / names.step_name(step) / names.MANIFEST).write_text("{}")
    t = time.time() - 60
    st = new_state("r", run_dir, str(tmp_path / "r.toml"))
    st.update(phase="stopped", since=t, updated=t, supervisor=None,
              local_checkpoint={"step": 50, "time": t, "path": str(root / names.step_name(50))},
              sync={"state": "off", "since": t, "error": None, "attempts": 0}, remote_checkpoint=None)
    atomic_write_json(run_dir / names.STATE, st)
    for path in (run_dir, run_dir / names.STATE, root.parent, root, *root.iterdir(), *root.glob("*/*")):
        os.chown(path, OTHER, OTHER)
    out = io.StringIO()
    assert views.status(run_dir, out=out) == 0
    assert "local checkpoint: step 250 (" in out.getvalue(), out.getvalue()


def test_sample_export_and_verify_skip_a_scratch_another_user_took_and_read_the_remote(rebooted):
    """`sample/export/verify RUN_DIR` (checkpoint_select.run_roots) judge the scratch as `status` and `stop` do: his
    root is left out, said, and her run.remote read (before: the whole run refused, `its scratch is not looked
    in`, though her remote held her checkpoints; review9c finding 5)."""
    from minilmd.checkpoint_select import run_roots
    from minilmd.checkpoint_verify import verify_run

    run_dir, private = rebooted
    remote = run_dir.parent / "remote"
    run = run_roots(run_dir)
    assert run.roots == [remote] and run.found() == [("run.remote", remote)] and run.unread == ""
    assert f"its scratch {private / 'r'} is not looked in: {private} belongs to" in run.gone, run.gone
    report = verify_run(run_dir)
    assert [r["kind"] for r in report["run"]["roots"]] == ["run.remote"], report
    assert [c["root"] for c in report["checkpoints"]] == ["run.remote"] and "99999" not in json.dumps(report)


def test_roots_sample_of_a_users_run_looks_in_her_own_scratch(tmp_path):
    """run_roots judges the scratch for the run directory's owner, as `status` does: root reading her run (its
    run.toml one root may read: its own copy) finds her scratch hers (before: judged for root, her own directories
    were "another user's" and the run refused)."""
    if UID != 0:
        pytest.skip("needs root to read another user's run")
    from minilmd.checkpoint_select import run_roots

    run_dir, scratch = tmp_path / "run", tmp_path / "scratch"
    run_dir.mkdir()
    (scratch / names.CHECKPOINTS).mkdir(parents=True)
    (run_dir / names.RUN_CONFIG_COPY).write_text(f'[run]\nname = "r"\ndir = "{run_dir}"\nscratch = "{scratch}"\n'
                                                 f'[data]\nprepared = "{run_dir}"\n[train]\nmax_steps = 1\n')
    for path in (run_dir, scratch, scratch / names.CHECKPOINTS):
        os.chown(path, OTHER, OTHER)
    run = run_roots(run_dir)
    assert run.roots == [scratch / names.CHECKPOINTS] and not run.skipped
