"""Sync of checkpoints to a remote (local path and memory://) and back: verified copies, LATEST only ever naming a
valid checkpoint (also when a sync is SIGKILLed half-way), retention, damaged copies, fetch for a resume."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import fsspec
import pytest

from minilmd import checkpoint as ck
from minilmd import checkpoint_dirs
from minilmd.daemon.jobs import remote_local
from minilmd.daemon.jobs import sync as sync_module
from minilmd.daemon.jobs.remote_local import LocalRemote
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import RemoteFull, SyncError
from minilmd.names import QUARANTINE
from minilmd.tmpnames import host_tag, sync_tmp_name
from minilmd.untrusted import Unreadable
from sync_helpers import (  # noqa: F401 - dirs, weights: fixtures
    EXPECTED,
    KILL_MID_SYNC,
    StaleSizes,
    corrupt,
    dirs,
    names,
    save,
    weights,
)
from waiting import wait_until, without_blocking


def test_sync_copies_verifies_and_points_latest(dirs, weights):
    local, remote = dirs
    save(local, 10, weights)
    logs = []
    result = Syncer(local, str(remote), EXPECTED, keep=3, log=logs.append).sync_newest()
    assert (result.step, result.copied, result.verified) == (10, True, True)
    assert result.path == f"{remote}/step-00000010" and result.bytes > 0
    assert ck.validate(remote / "step-00000010", EXPECTED)["step"] == 10
    assert checkpoint_dirs.read_latest(remote) == "step-00000010"
    assert names(remote) == ["LATEST", "step-00000010"]  # no temp names left
    assert any("copied" in m and "verified" in m for m in logs)

    again = Syncer(local, str(remote), EXPECTED).sync_newest()
    assert (again.step, again.copied) == (10, False)


def test_newer_checkpoints_are_synced_and_retention_keeps_n(dirs, weights):
    local, remote = dirs
    syncer = Syncer(local, str(remote), EXPECTED, keep=2)
    for step in (10, 20, 30):
        save(local, step, weights)
        assert syncer.sync_newest().step == step
    assert names(remote) == ["LATEST", "step-00000020", "step-00000030"]
    assert checkpoint_dirs.read_latest(remote) == "step-00000030"


def test_invalid_newest_local_checkpoint_is_not_synced(dirs, weights):
    local, remote = dirs
    save(local, 10, weights)
    corrupt(save(local, 20, weights) / ck.MODEL_FILE)
    save(local, 30, weights, data="x" * 64)  # another corpus: a mismatch, never synced for this run
    logs = []
    result = Syncer(local, str(remote), EXPECTED, log=logs.append).sync_newest()
    assert result.step == 10
    assert checkpoint_dirs.read_latest(remote) == "step-00000010"
    assert not (remote / "step-00000020").exists() and not (remote / "step-00000030").exists()
    assert any("step-00000020" in m and "sha256" in m for m in logs)
    assert any("step-00000030" in m and "data fingerprint" in m for m in logs)


def test_nothing_to_sync_and_nothing_older_than_the_remote(dirs, weights):
    local, remote = dirs
    remote.parent.mkdir()  # the share: in an empty directory, not a mount point, a sync makes nothing (unmounted)
    assert Syncer(local, str(remote)).sync_newest().step is None
    other = local.parent / "other"
    save(other, 50, weights)
    Syncer(other, str(remote), EXPECTED).sync_newest()
    save(local, 40, weights)
    result = Syncer(local, str(remote), EXPECTED).sync_newest()
    assert (result.step, result.copied) == (50, False)
    assert not (remote / "step-00000040").exists()


def test_leftovers_of_an_interrupted_sync_are_cleaned_and_another_hosts_copy_is_left(dirs, weights):
    """The half copy a killed sync of this run left (made by its make_tmp, so in the run's record) goes at the next
    sync; another host's, live or a day old, is no copy this run has a record of making: left, and said."""
    local, remote = dirs
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED).sync_newest()
    dead = subprocess.Popen(["true"])
    dead.wait()
    killed = Syncer(local, str(remote), EXPECTED)  # the run's sync in a process now gone: its record stays
    ours = remote / killed.remote.make_tmp(sync_tmp_name("step-00000020", host_tag(), dead.pid))
    live_elsewhere = remote / sync_tmp_name("step-00000020", "otherhost", os.getpid())
    old_elsewhere = remote / sync_tmp_name("step-00000015", "otherhost", 4242)
    old_pointer_tmp = remote / ".LATEST.abc123.tmp"
    for tmp in (ours, live_elsewhere, old_elsewhere):
        tmp.mkdir(exist_ok=tmp == ours)
        (tmp / ck.MODEL_FILE).write_bytes(b"half")
    old_pointer_tmp.write_text("step-00000015\n")
    day_ago = time.time() - sync_module.STALE_TMP_SECONDS - 60
    for stale in (old_elsewhere, old_pointer_tmp):
        os.utime(stale, (day_ago, day_ago))
    save(local, 20, weights)
    logs: list[str] = []
    assert Syncer(local, str(remote), EXPECTED, log=logs.append).sync_newest().step == 20
    assert names(remote) == [old_elsewhere.name, live_elsewhere.name, "LATEST", "step-00000010", "step-00000020"]
    assert (live_elsewhere / ck.MODEL_FILE).read_bytes() == b"half"
    assert any(old_elsewhere.name in m and "no record of making" in m for m in logs)


def test_damaged_remote_copy_is_replaced(dirs, weights):
    local, remote = dirs
    save(local, 10, weights)
    syncer = Syncer(local, str(remote), EXPECTED)
    syncer.sync_newest()
    os.truncate(remote / "step-00000010" / ck.OPTIMIZER_FILE, 10)
    result = syncer.sync_newest()
    assert result.copied and ck.validate(remote / "step-00000010", EXPECTED)
    assert len(list((remote / QUARANTINE).iterdir())) == 1


def test_unusable_remote_raises_sync_error(dirs, weights):
    local, remote = dirs
    save(local, 10, weights)
    remote.parent.mkdir(parents=True)
    remote.write_text("a file where the remote directory should be")
    with pytest.raises(SyncError, match=f"sync to {remote} failed"):
        Syncer(local, str(remote), EXPECTED).sync_newest()
    with pytest.raises(SyncError, match="cannot open remote"):
        Syncer(local, "nosuchproto://x", EXPECTED).sync_newest()


@pytest.mark.slow
@pytest.mark.parametrize("kill_at_put", [1, 3, 5])  # first file, middle, the manifest itself
def test_sync_killed_half_way_never_moves_latest_to_an_invalid_checkpoint(dirs, weights, kill_at_put):
    local, remote = dirs
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED).sync_newest()
    save(local, 20, weights)
    proc = subprocess.run([sys.executable, "-c", KILL_MID_SYNC, str(local), str(remote), str(kill_at_put)])
    assert proc.returncode == -9
    assert checkpoint_dirs.read_latest(remote) == "step-00000010"
    assert checkpoint_dirs.list_checkpoints(remote) == [remote / "step-00000010"]
    assert any(n.startswith(".tmp-step-00000020") for n in names(remote))
    result = Syncer(local, str(remote), EXPECTED).sync_newest()
    assert result.step == 20 and checkpoint_dirs.read_latest(remote) == "step-00000020"
    assert names(remote) == ["LATEST", "step-00000010", "step-00000020"]


def test_fetch_latest_skips_and_quarantines_a_corrupt_remote_checkpoint(dirs, weights, tmp_path):
    local, remote = dirs
    source = tmp_path / "old-scratch"
    syncer = Syncer(source, str(remote), EXPECTED, keep=3)
    for step in (10, 20):
        save(source, step, weights)
        syncer.sync_newest()
    assert syncer.fetch_latest(tmp_path / "first") == tmp_path / "first" / "step-00000020"
    corrupt(remote / "step-00000020" / ck.TRAINER_STATE)
    logs = []
    fetched = Syncer(local, str(remote), EXPECTED, log=logs.append).fetch_latest()
    assert fetched == local / "step-00000010"
    assert ck.validate(fetched, EXPECTED)["step"] == 10
    assert checkpoint_dirs.read_latest(local) == "step-00000010"
    assert not (remote / "step-00000020").exists() and len(list((remote / QUARANTINE).iterdir())) == 1
    assert checkpoint_dirs.read_latest(remote) == "step-00000010"  # LATEST names only what validates
    assert any("invalid" in m and "sha256" in m for m in logs)
    assert [n for n in names(local) if n.startswith(".tmp")] == []


def test_a_fifo_listed_in_a_remote_checkpoint_never_blocks_the_fetch_nor_the_check(dirs, weights, tmp_path):
    """Another machine (or user) of a shared remote lists a FIFO with size 0 and the empty file's sha256 in the
    newest checkpoint: its check and its download opened the FIFO and waited for a writer for ever. It is an
    invalid checkpoint now (quarantined as any other), and the step before it is fetched."""
    import hashlib
    import threading

    local, remote = dirs
    syncer = Syncer(tmp_path / "old-scratch", str(remote), EXPECTED, keep=3)
    for step in (10, 20):
        save(tmp_path / "old-scratch", step, weights)
        syncer.sync_newest()
    newest = remote / "step-00000020"
    manifest = json.loads((newest / ck.MANIFEST).read_text())
    (newest / ck.TRAINER_STATE).unlink()
    os.mkfifo(newest / ck.TRAINER_STATE)
    manifest["files"][ck.TRAINER_STATE] = {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
    (newest / ck.MANIFEST).write_text(json.dumps(manifest))

    results: dict = {}
    def check_then_fetch():
        results["intact"] = remote_local.open_remote(str(remote)).intact("step-00000020", full_hash=True)[1]
        results["fetched"] = Syncer(local, str(remote), EXPECTED).fetch_latest()
    worker = threading.Thread(target=check_then_fetch, daemon=True)
    worker.start()
    worker.join(120)  # not a timing: the old code never returned
    if worker.is_alive():
        with open(newest / ck.TRAINER_STATE, "wb"):  # a writer releases the blocked open, and the test ends
            pass
        worker.join(30)
        pytest.fail("opening the listed FIFO blocked the check or the fetch")
    assert results["intact"] == [f"{remote}/step-00000020/{ck.TRAINER_STATE}: a FIFO, not a regular file"]
    assert results["fetched"] == local / "step-00000010"
    assert not newest.exists() and len(list((remote / QUARANTINE).iterdir())) == 1


def test_fetch_from_an_empty_remote(dirs):
    local, remote = dirs
    assert Syncer(local, str(remote)).fetch_latest() is None
    assert checkpoint_dirs.read_latest(remote) is None


def test_a_full_remote_is_remote_full_and_leaves_no_half_copy(tmp_path, weights, small_tmpfs):
    """A real tmpfs as the remote, another job's file leaving less room than a checkpoint: the sync fails as
    RemoteFull with the room left, and its half copy (`.tmp-step-*`) is gone at once, not at the next sync (a last
    sync has no next one); once there is room the same checkpoint syncs."""
    local, disk = tmp_path / "shm" / "checkpoints", small_tmpfs("1m")
    ckpt = save(local, 10, weights)
    remote = disk / "run"
    remote.mkdir()
    st = os.statvfs(disk)
    (disk / "another-job").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (8 << 10)))
    with pytest.raises(RemoteFull) as caught:
        Syncer(local, str(remote), EXPECTED).sync_newest()
    assert "No space left on device" in str(caught.value)
    needs = sum(p.stat().st_size for p in ckpt.iterdir())
    assert caught.value.free is not None and 0 < caught.value.free < needs, (caught.value.free, needs)
    assert names(remote) == []  # nothing of the failed copy
    assert ck.validate(ckpt, EXPECTED)["step"] == 10
    (disk / "another-job").unlink()
    assert Syncer(local, str(remote), EXPECTED).sync_newest().step == 10
    assert names(remote) == ["LATEST", "step-00000010"]


def test_memory_remote_sync_fetch_and_manifest_last(tmp_path, weights):
    fs = fsspec.filesystem("memory")
    url = f"memory://sync-test-{os.getpid()}"
    local = tmp_path / "ckpt"
    try:
        syncer = Syncer(local, url, EXPECTED, keep=1)
        save(local, 5, weights)
        assert syncer.sync_newest().step == 5
        # a copy interrupted on a store without rename: files under the final name, no manifest yet
        fs.makedirs(f"{url}/step-00000009", exist_ok=True)
        fs.pipe_file(f"{url}/step-00000009/{ck.MODEL_FILE}", b"partial")
        save(local, 7, weights)
        result = syncer.sync_newest()
        assert (result.step, result.removed) == (7, ("step-00000009", "step-00000005"))
        assert fs.cat_file(f"{url}/LATEST").decode().strip() == "step-00000007"
        fetched = syncer.fetch_latest(tmp_path / "fresh")
        assert ck.validate(fetched, EXPECTED)["step"] == 7
        manifest = json.loads(fs.cat_file(f"{url}/step-00000007/{ck.MANIFEST}"))
        assert set(manifest["files"]) >= set(ck.REQUIRED_FILES)
    finally:
        fs.rm(url, recursive=True)


def test_a_rename_or_latest_replacement_that_silently_does_nothing_is_an_error(dirs, weights, monkeypatch):
    local, remote = dirs
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED).sync_newest()
    save(local, 20, weights)

    with monkeypatch.context() as m:
        m.setattr(LocalRemote, "rename_dir", lambda self, src, dst: None)  # a dropped rename (flaky NFS)
        with pytest.raises(SyncError, match="did not take effect"):
            Syncer(local, str(remote), EXPECTED).sync_newest()
    assert checkpoint_dirs.read_latest(remote) == "step-00000010"
    with monkeypatch.context() as m:
        m.setattr(LocalRemote, "write_latest", lambda self, name: None)
        with pytest.raises(SyncError, match="does not read back as step-00000020"):
            Syncer(local, str(remote), EXPECTED).sync_newest()
    assert checkpoint_dirs.read_latest(remote) == "step-00000010"
    result = Syncer(local, str(remote), EXPECTED).sync_newest()  # the copy is there already: only LATEST moves
    assert (result.step, checkpoint_dirs.read_latest(remote)) == (20, "step-00000020")


def test_latest_never_moves_back_past_a_newer_intact_checkpoint(dirs, weights, monkeypatch):
    """A syncer that was slow (a thread left stalled on NFS, a supervisor that came back) finishes copying step 10
    after another has put step 20 on the remote and pointed LATEST at it: LATEST stays on step 20."""
    local, remote = dirs
    newer_scratch = local.parent / "newer"
    save(local, 10, weights)
    save(newer_scratch, 20, weights)
    newer = Syncer(newer_scratch, str(remote), EXPECTED)

    real_rename, overtaken = LocalRemote.rename_dir, []

    def rename_then_overtaken(self, src, dst):
        real_rename(self, src, dst)
        if dst == "step-00000010":  # in place, its LATEST not yet written: the other syncer gets there first
            overtaken.append(newer.sync_newest())

    monkeypatch.setattr(LocalRemote, "rename_dir", rename_then_overtaken)
    result = Syncer(local, str(remote), EXPECTED).sync_newest()
    assert [(r.step, r.copied) for r in overtaken] == [(20, True)]
    assert (result.step, result.copied) == (10, True)
    assert ck.read_latest(remote) == "step-00000020"
    assert [ck.validate(remote / n, EXPECTED)["step"] for n in ("step-00000010", "step-00000020")] == [10, 20]


# --- against a real misbehaving remote (tests/faultfs.py over FUSE; skipped where FUSE is unavailable) -----------

def synced_once(local: Path, remote: Path, weights) -> Syncer:
    save(local, 10, weights)
    syncer = Syncer(local, str(remote), EXPECTED)
    syncer.sync_newest()
    save(local, 20, weights)
    return syncer


@pytest.mark.slow
@pytest.mark.fuse
@pytest.mark.parametrize("fault", ["enospc", "drop_dir_rename", "drop_latest_rename", "shrink", "eio_readback"])
def test_faulty_remote_never_gets_a_latest_naming_an_invalid_checkpoint(faultfs, weights, tmp_path, fault):
    local, remote = tmp_path / "shm", faultfs.root / "nfs" / "run"
    syncer = synced_once(local, remote, weights)
    expected_error = {
        "enospc": (lambda: faultfs.enospc("*.tmp-step-00000020*/optimizer.safetensors"), "No space left"),
        "drop_dir_rename": (lambda: faultfs.drop_rename("*.tmp-step-00000020*"), "did not take effect"),
        "drop_latest_rename": (lambda: faultfs.drop_rename("LATEST"), "does not read back"),
        "shrink": (lambda: faultfs.shrink("*.tmp-step-00000020*/model.safetensors", 100), "size 100 bytes"),
        "eio_readback": (lambda: faultfs.fail_reads("*.tmp-step-00000020*/trainer_state.json"), "sha256|Errno 5"),
    }[fault]
    expected_error[0]()
    with pytest.raises(SyncError, match=expected_error[1]):
        syncer.sync_newest()
    assert faultfs.hits()
    assert checkpoint_dirs.read_latest(remote) == "step-00000010"
    ck.validate(remote / "step-00000010", EXPECTED)
    faultfs.clear()
    assert syncer.sync_newest().step == 20
    assert checkpoint_dirs.read_latest(remote) == "step-00000020"
    ck.validate(remote / "step-00000020", EXPECTED)
    assert [n for n in names(remote) if n.startswith(".")] == []


STALLED_SYNC = textwrap.dedent("""
    import sys
    from minilmd.daemon.jobs.sync import Syncer
    Syncer(sys.argv[1], sys.argv[2]).sync_newest()
""")


@pytest.mark.slow
@pytest.mark.fuse
def test_sync_killed_while_the_remote_stalls(faultfs, weights, tmp_path):
    local, remote = tmp_path / "shm", faultfs.root / "nfs" / "run"
    synced_once(local, remote, weights)
    faultfs.stall("*.tmp-step-00000020*/optimizer.json", 60, op="write")
    proc = subprocess.Popen([sys.executable, "-c", STALLED_SYNC, str(local), str(remote)])
    try:
        wait_until(lambda: faultfs.hits("stall") or proc.poll() is not None, 20, "the sync to reach the stall",
                   interval=0.05)
        assert faultfs.hits("stall"), "the sync never reached the stalled write"
        assert checkpoint_dirs.read_latest(remote) == "step-00000010"  # a stalled remote is behind, never wrong
    finally:
        proc.kill()
        faultfs.clear()
        proc.wait(timeout=30)
    assert checkpoint_dirs.read_latest(remote) == "step-00000010"
    result = Syncer(local, str(remote), EXPECTED).sync_newest()
    assert result.step == 20 and checkpoint_dirs.read_latest(remote) == "step-00000020"
    assert [n for n in names(remote) if n.startswith(".")] == []


def test_a_remote_checkpoint_file_written_past_its_listed_size_is_downloaded_no_further(dirs, weights, tmp_path):
    """On main a file of a remote checkpoint was downloaded to its end, however long another user made it."""
    _, remote = dirs
    syncer = Syncer(tmp_path / "source", str(remote), EXPECTED)
    save(tmp_path / "source", 10, weights)
    syncer.sync_newest()
    victim = remote / "step-00000010" / ck.TRAINER_STATE
    listed = victim.stat().st_size
    with victim.open("ab") as f:
        f.write(b" " * (8 << 20))
    tmp = tmp_path / "download"
    tmp.mkdir()
    problems = syncer._download("step-00000010", syncer.remote.read_manifest("step-00000010"), tmp)
    assert (tmp / ck.TRAINER_STATE).stat().st_size == listed + 1
    assert problems and ck.TRAINER_STATE in problems[0], problems


def test_a_remote_checkpoint_file_written_past_its_listed_size_is_hashed_no_further(dirs, weights, tmp_path):
    """On main the full check (`intact(full_hash=True)`: LATEST moved to a remote checkpoint, the push's read-back)
    hashed a file to its end, however long another user made it, when its size still read as listed."""
    local, remote = dirs
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED).sync_newest()
    victim = remote / "step-00000010" / ck.TRAINER_STATE
    listed = victim.read_bytes()
    with victim.open("ab") as f:
        f.write(b"x" * (8 << 20))
    stale = StaleSizes(str(remote), {f"step-00000010/{ck.TRAINER_STATE}": len(listed)})
    _, problems = stale.intact("step-00000010", full_hash=True)
    read = hashlib.sha256(listed + b"x").hexdigest()  # one byte past the listed size, no further
    assert len(problems) == 1 and f"file has {read[:16]}" in problems[0], problems


@pytest.mark.parametrize("target", ["another user's file", "fifo", "/dev/zero"])
def test_a_link_placed_in_a_remote_checkpoint_is_never_followed(dirs, weights, tmp_path, target):
    """On main a local remote's checks and downloads followed a symlink in a checkpoint: to another user's file of
    the same bytes, the checkpoint verified and was fetched from it. It is a problem of the checkpoint now, saying
    what was found, and nothing it points at is opened."""
    local, remote = dirs
    save(tmp_path / "old-scratch", 10, weights)
    Syncer(tmp_path / "old-scratch", str(remote), EXPECTED).sync_newest()
    victim = remote / "step-00000010" / ck.TRAINER_STATE
    if target == "another user's file":
        pointed = tmp_path / "theirs"
        pointed.write_bytes(victim.read_bytes())
    elif target == "fifo":
        pointed = tmp_path / "fifo"
        os.mkfifo(pointed)
    else:
        pointed = Path(target)
    victim.unlink()
    victim.symlink_to(pointed)
    said = f"{victim}: a symbolic link to {pointed}, not followed"
    def whole_check():
        return remote_local.open_remote(str(remote)).intact("step-00000010", full_hash=True)[1]

    assert without_blocking(whole_check) == [said]
    opened = remote_local.open_remote(str(remote))  # the opens themselves, past the checks (a link placed meanwhile)
    for read in (lambda: opened.sha256("step-00000010", ck.TRAINER_STATE, size=1),
                 lambda: opened.get(("step-00000010", ck.TRAINER_STATE), tmp_path / "got", 1)):
        with pytest.raises(Unreadable, match="a symbolic link"):
            without_blocking(read)
    logs: list[str] = []
    assert without_blocking(lambda: Syncer(local, str(remote), EXPECTED, log=logs.append).fetch_latest()) is None
    assert any(said in m for m in logs), logs
    assert not (local / "step-00000010").exists()


def test_a_remote_step_directory_that_is_a_link_is_neither_read_moved_nor_deleted(dirs, weights, tmp_path):
    """A step directory placed on a local remote as a link to another user's checkpoint: on main it was read
    through (fetched from, counted by retention). Now it is not read, not quarantined (the reason would be written
    into their directory), not deleted by retention (not this run's), and the run's own checkpoint is fetched."""
    local, remote = dirs
    theirs = tmp_path / "theirs"
    save(theirs, 20, weights)
    save(tmp_path / "old-scratch", 10, weights)
    syncer = Syncer(tmp_path / "old-scratch", str(remote), EXPECTED, keep=1)
    syncer.sync_newest()
    (remote / "step-00000020").symlink_to(theirs / "step-00000020")
    before = sorted(p.name for p in (theirs / "step-00000020").iterdir())
    logs: list[str] = []
    fetched = Syncer(local, str(remote), EXPECTED, log=logs.append).fetch_latest()
    assert fetched == local / "step-00000010", logs
    assert any(f"{remote}/step-00000020 is a symbolic link to {theirs}/step-00000020" in m for m in logs), logs
    (remote / "step-00000005").symlink_to(theirs / "step-00000020")  # below the kept window: retention's to judge
    syncer.sync_newest()  # retention with keep=1
    assert (remote / "step-00000020").is_symlink() and (remote / "step-00000010").is_dir()
    assert (remote / "step-00000005").is_symlink()
    assert sorted(p.name for p in (theirs / "step-00000020").iterdir()) == before
