"""`minilmd run --check` says that the run's recorded remote root is gone or replaced (daemon/preflight.py
remote_root_wait, by daemon/jobs/remote_root.py's rule and words).

Before, `--check` said OK with nothing of it: the user learnt only after starting, from each sync failing with
"remote unavailable: run.remote R is gone (...)" or "... is not the directory this run synced to (...)". Now the
same words come at `--check` as a `waits:` line (the run is not refused: a share mounted again is its remote again),
with what to do; `--check --claim-remote`, which takes the directory there now, says none; `--check` creates
nothing. Real `minilmd run --check` processes; the record written by a real sync of the run (its claim)."""
from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

import pytest

import fake_trainer
from faults_fixtures import faultfs_dirs, mounted_faultfs
from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.jobs import remote_claim
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import SyncError
from supervisor_helpers import cli, write_config

WAITS = "waits: run.remote: remote unavailable: run.remote "


def _sync_of_the_run(tmp_path: Path, cfg) -> Syncer:
    """A sync of the run of `cfg` (its claim and run.dir: its record of the remote's root lands there) from
    checkpoints outside its scratch, which stays empty."""
    local = tmp_path / "saved"
    fake_trainer.save(local, 10, 1, cfg, fake_trainer.fingerprints(Path(cfg.data.prepared)), keep=2)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    return Syncer(local, cfg.run.remote, None, claim=remote_claim.claim_of(cfg), run_dir=cfg.run_dir)


def _record_synced(cfg, step: int) -> None:
    """state.json as a supervisor leaves it after a sync of `step` to run.remote."""
    state = new_state(cfg.run.name, cfg.run_dir, "config.toml")
    state.update(phase="stopped", remote_checkpoint={"step": step, "time": 1.0, "verified": True,
                                                     "path": f"{cfg.run.remote}/{names.step_name(step)}"})
    (cfg.run_dir / names.STATE).write_text(json.dumps(state))


def _checked(config: Path, *args: str) -> str:
    done = cli("run", "--check", str(config), *args)
    assert done.returncode == 0, done.stdout + done.stderr  # waited for, never refused
    return done.stdout


@pytest.mark.parametrize("how", ["moved-away", "replaced"])
def test_check_says_a_synced_root_gone_or_replaced_in_the_syncs_words(tmp_path, corpus, how):
    remote = tmp_path / "share" / "remote"
    config = write_config(tmp_path, corpus, run={"remote": str(remote)})
    cfg = load_config(config)
    assert _sync_of_the_run(tmp_path, cfg).sync_newest().step == 10
    _record_synced(cfg, 10)
    assert WAITS not in _checked(config)  # the root synced to is there: nothing to say
    remote.rename(tmp_path / "share" / "moved")
    if how == "replaced":
        remote.mkdir()
    said = _checked(config)
    if how == "moved-away":
        assert f"{WAITS}{remote} is gone (it was dev " in said and "state.json records step 10 on it; an " \
               "unmounted share?)" in said, said
        assert not remote.exists()  # --check makes nothing
    else:
        assert f"{WAITS}{remote} is not the directory this run synced to (was dev " in said and \
               "another directory of the same file system" in said, said
        assert os.listdir(remote) == []
    assert "`minilmd run --claim-remote CONFIG`" in said and "every sync of the run fails so" in said, said
    assert WAITS not in _checked(config, "--claim-remote")  # the directory there now is taken: nothing waits


@pytest.mark.fuse
def test_check_says_a_share_unmounted_after_the_claim_before_any_completed_sync_is_gone(tmp_path, corpus):
    backing, mount_point = faultfs_dirs(tmp_path)
    remote = mount_point / "remote"
    config = write_config(tmp_path, corpus, run={"remote": str(remote)})
    cfg = load_config(config)
    with contextlib.ExitStack() as stack:
        share = stack.enter_context(mounted_faultfs(backing, mount_point))
        share.fail_writes("*.safetensors", errno.EIO)  # claimed and recorded, the copy fails: no sync completed
        with pytest.raises(SyncError):
            _sync_of_the_run(tmp_path, cfg).sync_newest()
        share.clear()
        assert WAITS not in _checked(config)
        share.unmount()  # its mount point an empty directory of the local disk
        said = _checked(config)
        assert f"{WAITS}{remote} is gone (it was dev " in said and f"mounted at {mount_point}; its path is now on " \
               in said and "an unmounted share?)" in said, said
        assert os.listdir(mount_point) == []  # --check makes nothing there
