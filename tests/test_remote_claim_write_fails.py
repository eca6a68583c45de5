"""The first sync's claim (run.remote/owner.json) is made whole or not at all (remote_claim.write_new,
RemoteStore.put_new); the cut claim an older minilmd left is replaced only when it is this run's own.

Observed before (fault audit 7, F1): the first sync's write of owner.json failed partway (a full share, ENOSPC; or
EIO from a flaky FUSE/NFS) and left a 0-byte owner.json. Every later sync read it as "owner.json is not valid JSON"
and was refused; the last sync was refused 3 times and the supervisor exited 0, state done, its final checkpoint
only in scratch; a later `minilmd run` exited 2. Now the claim is written under a temporary name, fsynced and renamed
into place without replacing: a failed write leaves nothing and is a failed sync (a full remote: the wait for room),
and the run finishes with its last checkpoint on the remote once the fault clears.
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs, names, run_owner, tmpnames
from minilmd.config import load_config
from minilmd.daemon.jobs import remote_claim
from minilmd.daemon.jobs.remote_local import open_remote
from reliability_helpers import fake_weights_of, undisturbed_fake_weights
from supervisor_helpers import start_supervisor, state, wait_for, wait_or_kill, write_config

OWNER = names.REMOTE_OWNER


def _claim(run_dir: Path) -> remote_claim.Claim:
    return remote_claim.Claim(run_dir, "r")


def _remote(tmp_path: Path) -> tuple[Path, object]:
    root = tmp_path / "remote"
    root.mkdir()
    return root, open_remote(str(root), tmpnames.pointer_tmp_tag(tmpnames.host_tag(), os.getpid()))


def _whole(run_dir: Path) -> bytes:
    return run_owner.encode(run_owner.record(run_dir, "r"))


def test_a_claim_whose_write_fails_leaves_no_file_and_raises_the_write_error(tmp_path, monkeypatch):
    root, store = _remote(tmp_path)
    claim = _claim(tmp_path / "run")
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as failed:  # the write's own error: the sync's remote-full wait (not a refusal)
        remote_claim.ensure(store, claim)
    assert failed.value.errno == errno.ENOSPC and not isinstance(failed.value, remote_claim.ClaimRefused)
    assert os.listdir(root) == [], os.listdir(root)  # no owner.json, no temporary left
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert remote_claim.ensure(store, claim) is True  # the fault gone: claimed whole
    assert run_owner.is_run(remote_claim.read(store), claim.run_dir)
    assert os.listdir(root) == [OWNER]


@pytest.mark.parametrize("cut", [0, 1, 30, -3])
def test_the_cut_start_of_this_runs_own_claim_is_replaced_whole(tmp_path, cut):
    root, store = _remote(tmp_path)
    claim = _claim(tmp_path / "run")
    whole = _whole(claim.run_dir)
    (root / OWNER).write_bytes(whole[:cut])  # what an older minilmd's failed write left
    assert remote_claim.problem(store, claim) is None
    assert remote_claim.ensure(store, claim) is True
    assert (root / OWNER).read_bytes() == remote_claim.encoded(claim, store)  # the whole claim, as written now
    assert sorted(os.listdir(root)) == [OWNER]


def test_a_cut_claim_of_another_run_or_a_cut_one_beside_checkpoints_stays_a_refusal(tmp_path):
    root, store = _remote(tmp_path)
    claim = _claim(tmp_path / "run")
    other = _whole(tmp_path / "other-run")[:-2]  # another run's claim, cut: its run_dir is not this run's
    (root / OWNER).write_bytes(other)
    with pytest.raises(remote_claim.ClaimRefused, match="not valid JSON"):
        remote_claim.ensure(store, claim)
    assert (root / OWNER).read_bytes() == other  # left as it is

    (root / OWNER).write_bytes(b"")  # empty, but beside checkpoints this run's records do not say it synced
    (root / "step-00000010").mkdir()
    with pytest.raises(remote_claim.ClaimRefused, match="do not say it synced there"):
        remote_claim.ensure(store, claim)
    assert (root / OWNER).read_bytes() == b""


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_another_users_empty_owner_json_is_never_replaced(tmp_path):
    root, store = _remote(tmp_path)
    (root / OWNER).write_bytes(b"")
    os.chown(root / OWNER, 12345, 12345)
    with pytest.raises(remote_claim.ClaimRefused, match="another user's file"):
        remote_claim.ensure(store, _claim(tmp_path / "run"))
    assert (root / OWNER).stat().st_uid == 12345 and (root / OWNER).read_bytes() == b""


def test_the_claims_temporary_name_is_one_the_leftover_clean_up_knows_as_this_pids():
    tag = tmpnames.pointer_tmp_tag("h", 42)
    assert tmpnames.remote_tmp_owner(f".{OWNER}.{tag}0a1b2c3d.tmp", "h") == 42
    assert tmpnames.remote_tmp_owner(f".{OWNER}.{tag}0a1b2c3d.tmp", "other") is None


# --- a real supervisor whose remote fails the claim's write, then recovers ---------------------------------------

def _finishes_synced_after(tmp_path: Path, corpus, remote: Path, words: str, fault_seen, clear) -> None:
    """A run (the fake trainer held before its last step) whose first syncs meet the fault: once a sync failed and
    `fault_seen()`, its error says `words` and no owner.json is there; `clear()` lifts the fault, the trainer goes
    on, and the run ends finished with its last checkpoint on the remote, as an undisturbed run's."""
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote)})
    cfg = load_config(config)
    release = tmp_path / "release"
    sup = start_supervisor(config, tmp_path / "sup.out", FAKE_HOLD=f"29:{release}")
    try:
        wait_for(lambda: _sync_error(tmp_path) and fault_seen(), 300, "a sync to fail on the claim's write")
        assert words in _sync_error(tmp_path), _sync_error(tmp_path)
        assert not (remote / OWNER).exists(), "a half-written claim was left"
        assert state(cfg.run_dir).get("remote_checkpoint") is None
        clear()
        release.touch()
        rc = wait_or_kill(sup, timeout=600)
    finally:
        clear()
        if sup.poll() is None:
            sup.kill()
    out = (tmp_path / "sup.out").read_text()[-3000:]
    assert rc == 0, out
    st = state(cfg.run_dir)
    assert st["phase"] == "done" and st["remote_checkpoint"]["step"] == 30, out
    assert checkpoint_dirs.read_latest(remote) == "step-00000030"
    assert fake_weights_of(remote / "step-00000030") == undisturbed_fake_weights(config)
    assert run_owner.is_run(run_owner.checked(json.loads((remote / OWNER).read_text()), OWNER), cfg.run_dir)


def _sync_error(tmp_path: Path) -> str:
    """The error of the run's last sync, as state.json has it ("" while none)."""
    return str((state(tmp_path / "s" / "run").get("sync") or {}).get("error") or "")


@pytest.mark.slow
@pytest.mark.root
def test_a_remote_full_at_the_first_sync_is_waited_for_and_the_run_finishes_synced(tmp_path, corpus, small_tmpfs):
    disk = small_tmpfs("16m")
    remote = disk / "remote"
    remote.mkdir()
    filler = disk / "another-users-file"
    with open(filler, "wb") as out:  # the share full before the first sync (room enough at the launch's check)
        try:
            while True:
                out.write(b"\0" * (64 << 10))
                out.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC

    def free() -> None:
        filler.unlink(missing_ok=True)

    _finishes_synced_after(tmp_path, corpus, remote, "remote full", lambda: True, free)


@pytest.mark.slow
@pytest.mark.fuse
def test_eio_on_the_claims_write_is_a_failed_sync_and_the_run_finishes_synced(tmp_path, corpus, faultfs):
    faultfs.fail_writes("*owner.json*", errno=errno.EIO)  # owner.json and the temporary it is written under

    _finishes_synced_after(tmp_path, corpus, faultfs.root / "remote", "Input/output error",
                           lambda: bool(faultfs.hits()), faultfs.clear)
