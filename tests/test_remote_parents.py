"""path_checks.remote_parents_refused, the one rule of the directories the sync makes above a local run.remote and of
what `run --check` refuses: a missing chain is refused only where shares are mounted ("/", a mount parent), never in
the user's home nor below another directory (/root, /workspace, /tmp/x); an empty directory is an unmounted share's
stub only where a share is set up to be mounted, never one the user just made (review10c findings 1 and 2)."""
from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import pytest

from minilmd import mount_places
from minilmd.path_checks import remote_parents_refused
from supervisor_helpers import cli, write_config


@pytest.fixture
def in_tmp():
    """A fresh name in /tmp (a top-level directory that is no mount parent, as /workspace or /root in a container),
    removed after the test if a regression made it."""
    top = Path("/tmp") / f"minilmd-rp-{secrets.token_hex(4)}"
    yield top
    if top.is_dir() and not top.is_symlink():
        shutil.rmtree(top)


def test_a_chain_below_a_top_level_directory_that_is_no_mount_parent_is_made(in_tmp):
    """Before: `/tmp/x/y`, `/root/ckpt/run1`, `/workspace/runs/r1` were all refused, every directory in "/" taken
    for a place shares are mounted."""
    if "/tmp" in mount_places.snapshot().parents():
        pytest.skip("this machine mounts something in /tmp")
    assert remote_parents_refused(str(in_tmp / "x" / "y")) == ""


def test_a_chain_in_a_mount_parent_is_refused_but_not_in_the_home(tmp_path, monkeypatch):
    monkeypatch.setattr(mount_places, "KNOWN_PARENTS", (str(tmp_path),))
    monkeypatch.setenv("HOME", "/nonexistent-home")
    said = remote_parents_refused(str(tmp_path / "nfs" / "me" / "w0"))
    assert f"{tmp_path} holds no nfs, and nothing is made in {tmp_path}, where shares are mounted" in said, said
    monkeypatch.setenv("HOME", str(tmp_path))  # root's home /root, a user's own directories: made
    assert remote_parents_refused(str(tmp_path / "nfs" / "me" / "w0")) == ""


def test_an_empty_directory_the_user_just_made_is_no_stub(tmp_path):
    """Before: `mkdir mine` then run.remote = mine/minilmd/run1 was refused as an unmounted share's stub."""
    mine = tmp_path / "mine"
    mine.mkdir()
    assert remote_parents_refused(str(mine / "minilmd" / "run1")) == ""


def test_an_empty_configured_mount_point_is_a_stub(tmp_path, monkeypatch):
    stub = tmp_path / "data"
    stub.mkdir()
    monkeypatch.setattr(mount_places, "snapshot", lambda: mount_places.MountConfig(frozenset({str(stub)})))
    said = remote_parents_refused(str(stub / "me" / "w0"))
    assert f"({stub} is an empty directory, not a mount point)" in said, said


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a directory to another user")
def test_a_users_empty_directory_in_a_mount_parent_is_no_stub_but_roots_is(tmp_path, monkeypatch):
    monkeypatch.setattr(mount_places, "KNOWN_PARENTS", (str(tmp_path),))
    monkeypatch.setenv("HOME", "/nonexistent-home")
    share = tmp_path / "share"
    share.mkdir()  # root's: a mount point's expected place
    assert "is an empty directory, not a mount point" in remote_parents_refused(str(share / "me" / "w0"))
    os.chown(share, 4321, 4321)  # a user's own
    assert remote_parents_refused(str(share / "me" / "w0")) == ""


def test_run_check_passes_a_remote_below_tmp_and_makes_nothing(tmp_path, corpus, in_tmp):
    if "/tmp" in mount_places.snapshot().parents():
        pytest.skip("this machine mounts something in /tmp")
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(in_tmp / "ckpt" / "run1")})
    checked = cli("run", "--check", str(config), timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert not os.path.lexists(in_tmp)


@pytest.mark.parametrize("scheme", ["file://", "local://"])
def test_a_file_url_remote_is_checked_as_the_local_path_the_sync_writes(tmp_path, corpus, scheme):
    """Before: `--check` and the launch passed a file:// remote by (its protocol known), while the sync refused to
    make its chain at every try, for the whole run. Now both say no, by the one rule."""
    from minilmd.config import ConfigError
    from minilmd.daemon import preflight
    from minilmd.daemon.jobs.remote_local import LocalRemote

    top = Path("/") / f"minilmd-no-share-{secrets.token_hex(4)}"
    remote = f"{scheme}{top}/me/w0"
    try:
        with pytest.raises(FileNotFoundError):
            LocalRemote(str(top / "me" / "w0")).makedirs()
        config = write_config(tmp_path, corpus, remote=False, run={"remote": remote})
        with pytest.raises(ConfigError) as err:
            preflight.check_with_waits(str(config))
        assert f"{top / 'me'} is not there (/ holds no {top.name}" in str(err.value), err.value
    finally:
        if top.is_dir() and not top.is_symlink():
            shutil.rmtree(top)
    assert not os.path.lexists(top)
