"""A local remote that others write too, against the sync's writes and deletions: a link placed at a name the sync
is about to write (its temporary copy, the LoRA base's, a file in it, a directory on the way) never redirects a
write to the file it points at (the victim, here a file of the test standing for ~/.bashrc), and what another user
made there is never deleted, moved or written into (a real second user, `nobody`, where ownership matters)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from minilmd import dirfd, perms, tmpnames
from minilmd.daemon.jobs import basecopy
from minilmd.daemon.jobs import sync as sync_module
from minilmd.daemon.jobs.remote_local import LocalRemote, open_remote
from minilmd.daemon.jobs.sync import Syncer
from minilmd.daemon.jobs.sync_errors import SyncError
from minilmd.init_source import STAGED_PTH
from minilmd.names import LATEST, MANIFEST, MODEL_FILE, QUARANTINE
from minilmd.proc_info import this_maker
from minilmd.tmpnames import pointer_tmp_tag, remote_tmp_maker, remote_tmp_owner, sync_tmp_name
from second_user import second_user, sh_as_user, shared  # noqa: F401 - shared: a fixture
from sync_helpers import EXPECTED, corrupt, save, weights  # noqa: F401 - weights: a fixture
from waiting import without_blocking

VICTIM_TEXT = "export PATH=/usr/bin\n"


@pytest.fixture
def victim(tmp_path) -> Path:
    """A directory the sync's user may write, holding a file it must never write (~/.bashrc)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(VICTIM_TEXT)
    return home


def untouched(home: Path) -> bool:
    return [p.name for p in home.iterdir()] == [".bashrc"] and (home / ".bashrc").read_bytes() == VICTIM_TEXT.encode()


class RacedRemote(LocalRemote):
    """A remote where another user wins each race: right after the sync removes `at` (or makes it, `inside`), a link
    to `to` appears there (or at `inside` in it)."""

    def __init__(self, url: str, at: str, to: Path, inside: str | None = None):
        super().__init__(url, pointer_tmp_tag(tmpnames.host_tag(), os.getpid()))
        self.at, self.to, self.inside, self.planted = at, to, inside, False

    def _plant(self, *names: str) -> None:
        if not self.planted:
            self.planted = True
            os.symlink(self.to, self.path(*names))

    def rm(self, *names: str, **kw):
        out = super().rm(*names, **kw)
        if names == (self.at,) and self.inside is None:
            self._plant(self.at)
        return out

    def makedirs(self, *names: str) -> None:
        super().makedirs(*names)
        if names[:1] == (self.at,) and self.inside is not None:
            self._plant(self.at, self.inside)


def raced_syncer(local: Path, remote: Path, **race) -> Syncer:
    syncer = Syncer(local, str(remote), EXPECTED)
    syncer._remote = RacedRemote(str(remote), sync_tmp_name("step-00000010", *this_maker()),
                                 **race)
    return syncer


def test_a_link_placed_at_the_temporary_copys_name_is_passed_by_not_written_through(tmp_path, weights, victim):
    """On main `makedirs(exist_ok=True)` took a link placed at `.tmp-step-...-<host>-<pid>` between the sync's rm
    and its makedirs for its own directory: every file of the checkpoint was written into the directory it points
    at. Then the directory was made new, but the sync failed at that predictable name for ever: one other user kept
    the run's checkpoints from the remote. Now the link is left, never written through, said once, and the copy
    made under a fresh name of the same host and pid (`-XXXXXXXX.tmp`)."""
    local, remote = tmp_path / "scratch", tmp_path / "remote"
    save(local, 10, weights)
    logs: list[str] = []
    syncer = raced_syncer(local, remote, to=victim)
    syncer.log = logs.append
    without_blocking(syncer.sync_newest)
    assert untouched(victim)
    at = syncer._remote.at
    assert sorted(os.listdir(remote)) == sorted([at, LATEST, "step-00000010"])
    assert os.readlink(remote / at) == str(victim)
    said = [m for m in logs if f"is already there (a symbolic link to {victim})" in m]
    assert len(said) == 1 and f"{remote}/{at}-" in said[0] and "copying under" in said[0], logs


def test_another_users_entry_at_the_temporary_name_is_left_and_the_sync_goes_on(shared, tmp_path, weights):
    """A real second user's directory at the predictable temporary name: left as it is, said once, the checkpoint
    copied under a fresh name that tmpnames.remote_tmp_maker reads back as this host's, pid's and start time's (the
    clean-up of a killed sync's leftovers still takes it)."""
    local, host = tmp_path / "scratch", tmpnames.host_tag()
    at = sync_tmp_name("step-00000010", *this_maker())
    sh_as_user(f"mkdir {at} && echo theirs > {at}/notes", cwd=shared)
    save(local, 10, weights)
    logs: list[str] = []
    made: list[str] = []
    syncer = Syncer(local, str(shared), EXPECTED, log=logs.append)
    real_make_tmp = syncer.remote.make_tmp

    def make_tmp(target, *below, **kw):
        made.append(real_make_tmp(target, *below, **kw))
        return made[-1]

    syncer.remote.make_tmp = make_tmp  # type: ignore[method-assign]
    without_blocking(syncer.sync_newest)
    assert (shared / at / "notes").read_text() == "theirs\n"
    assert sorted(os.listdir(shared)) == sorted([at, LATEST, "step-00000010"])
    assert made[0] != at and remote_tmp_maker(made[0], host) == this_maker()[1:]  # this pid, start time, boot
    assert sum("is already there" in m for m in logs) == 1, logs


def test_a_link_placed_at_a_file_name_in_the_temporary_copy_is_refused_not_written_through(tmp_path, weights,
                                                                                           victim):
    """On main `fs.open(..., "wb")` followed a link at a file's name in the copy and truncated the file it points at.
    Each file is opened O_CREAT|O_EXCL|O_NOFOLLOW now; the half copy is removed, the link in it not followed."""
    local, remote = tmp_path / "scratch", tmp_path / "remote"
    save(local, 10, weights)
    syncer = raced_syncer(local, remote, to=victim / ".bashrc", inside=MODEL_FILE)
    with pytest.raises(SyncError) as refused:
        without_blocking(syncer.sync_newest)
    assert untouched(victim)
    assert f"{MODEL_FILE} is already there (a symbolic link to {victim}/.bashrc)" in str(refused.value)
    assert sorted(os.listdir(remote)) == []  # the half copy removed, with the link in it (itself, not followed)


def test_a_directory_on_the_way_that_is_a_link_is_never_written_through(tmp_path, victim):
    """On main a write below a directory of the remote that is a link landed where the link points."""
    remote = open_remote(str(tmp_path / "remote"))
    remote.makedirs()
    os.symlink(victim, remote.path("dir"))
    (tmp_path / "f").write_text("ours\n")
    for write in (lambda: remote.put(tmp_path / "f", "dir", "f"), lambda: remote.makedirs("dir", "sub")):
        with contextlib.suppress(OSError):
            write()
    assert untouched(victim)
    with pytest.raises(OSError, match=f"dir is a symbolic link to {victim}: not followed"):
        remote.put(tmp_path / "f", "dir", "f")
    with pytest.raises(OSError, match=f"dir is already there \\(a symbolic link to {victim}\\)"):
        remote.makedirs("dir", "sub")


def test_a_link_placed_at_the_lora_bases_temporary_name_is_passed_by(tmp_path, victim):
    """The LoRA base's copy (`.tmp-init-<host>-<pid>/`, then `checkpoint/` in it) is made the same way: a link at its
    temporary name is left, never written through, and the base copied under a fresh name (on main before: the push
    failed there at every sync)."""
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / STAGED_PTH).write_bytes(b"weights")
    (staged / basecopy.INIT_RECORD).write_text(json.dumps(
        {"kind": "minimind", "sha256": hashlib.sha256(b"weights").hexdigest()}))
    at = sync_tmp_name(basecopy.REMOTE_BASE, "h", 1)
    remote = RacedRemote(str(tmp_path / "remote"), at, victim)
    remote.makedirs()
    said: list[tuple[str, str]] = []
    assert without_blocking(lambda: basecopy.push(remote, staged, "h", 1, taken=lambda *a: said.append(a))) > 0
    assert untouched(victim)
    assert sorted(os.listdir(remote.root)) == sorted([at, basecopy.REMOTE_BASE])
    assert len(said) == 1 and f"already there (a symbolic link to {victim})" in said[0][0]
    assert remote_tmp_owner(said[0][1], "h") == 1


def test_a_link_at_a_pointers_temporary_name_is_passed_by(tmp_path, victim, monkeypatch):
    """A guard, not a change: a pointer's temp file (`.LATEST.<host>-<pid>-XXXX.tmp`) is Dir.write_atomic's, made
    O_CREAT|O_EXCL|O_NOFOLLOW at the root's descriptor; a link at the name it draws first is passed by for the next,
    never written through; a LATEST that is a link is replaced itself (rename), its target left."""
    remote = open_remote(str(tmp_path / "remote"), "h-1-")
    remote.makedirs()
    os.symlink(victim / ".bashrc", remote.path(".LATEST.h-1-first.tmp"))
    os.symlink(victim / ".bashrc", remote.path(LATEST))
    drawn: list[str] = []

    names = iter(("first", "second"))

    def token_hex(nbytes):
        drawn.append(name := next(names))
        return name

    monkeypatch.setattr(dirfd.secrets, "token_hex", token_hex)
    remote.write_latest("step-00000010")
    assert drawn == ["first", "second"]  # the first name met as taken, so a second one drawn and used
    assert untouched(victim)
    assert Path(remote.path(LATEST)).read_text() == "step-00000010\n"
    assert not os.path.islink(remote.path(LATEST))
    assert sorted(os.listdir(remote.root)) == [".LATEST.h-1-first.tmp", LATEST]  # the link left, the second renamed
    assert os.readlink(remote.path(".LATEST.h-1-first.tmp")) == str(victim / ".bashrc")


# --- what another user made is never deleted, moved, nor written into ------------------------------------------------
def _logged(logs: list[str], remote: Path, name: str, why: str) -> int:
    return sum(f"{remote}/{name} is {why}" in m and "left as it is" in m for m in logs)


def test_retention_and_the_clean_up_leave_what_another_user_made(shared, tmp_path, weights):
    """On main a remote step directory without a manifest, or with one that does not parse, was deleted by retention,
    a step beyond `keep` deleted whoever made it, and a day-old temporary name (another host's), or one naming this
    host and a pid that is gone, removed: another user's all of them (`nobody` here). Only this user's real
    directories are deleted now; the rest is left and said once, however many syncs."""
    local, uid = tmp_path / "scratch", second_user()[0]
    logs: list[str] = []
    syncer = Syncer(local, str(shared), EXPECTED, keep=1, log=logs.append)
    save(local, 10, weights)
    without_blocking(syncer.sync_newest)
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = tmpnames.host_tag()
    stale_tmp, dead_tmp = sync_tmp_name("step-00000003", "otherhost", 4242), sync_tmp_name("step-00000004", host,
                                                                                              dead.pid)
    pointer_tmp = f".LATEST.{pointer_tmp_tag(host, dead.pid)}x.tmp"
    sh_as_user(f"mkdir step-00000005 step-00000007 {stale_tmp} {dead_tmp} && echo '[[' > step-00000007/{MANIFEST} "
               f"&& echo half > {stale_tmp}/{MODEL_FILE} && echo step-00000005 > {pointer_tmp} "
               f"&& cp -r step-00000010 step-00000008", cwd=shared)
    day_ago = time.time() - sync_module.STALE_TMP_SECONDS - 60
    for stale in (stale_tmp, pointer_tmp):
        os.utime(shared / stale, (day_ago, day_ago))
    theirs = ["step-00000005", "step-00000007", "step-00000008", stale_tmp, dead_tmp, pointer_tmp]
    save(local, 20, weights)
    for _ in range(2):
        without_blocking(syncer.sync_newest)
    assert sorted(os.listdir(shared)) == sorted([*theirs, LATEST, "step-00000020"]), logs  # step 10: ours, gone
    assert (shared / stale_tmp / MODEL_FILE).read_text() == "half\n"
    assert (shared / "step-00000007" / MANIFEST).read_text() == "[[\n"
    for name in theirs:
        kind = "a regular file" if name == pointer_tmp else "a directory"
        assert _logged(logs, shared, name, f"{kind} owned by uid {uid}") == 1, (name, logs)


def test_a_copy_never_replaces_another_users_entry_at_its_step_name(shared, tmp_path, weights):
    """On main the sync removed whatever held its step's name without a manifest before its rename (the rename, too,
    would have replaced it): another user's directory. It is left now and the copy fails saying why; its own
    verified copy is removed, not left behind."""
    local, uid = tmp_path / "scratch", second_user()[0]
    sh_as_user("mkdir step-00000010 && echo theirs > step-00000010/notes", cwd=shared)
    save(local, 10, weights)
    with pytest.raises(SyncError) as refused:
        without_blocking(Syncer(local, str(shared), EXPECTED).sync_newest)
    assert (shared / "step-00000010" / "notes").read_text() == "theirs\n"
    assert f"{shared}/step-00000010 is a directory owned by uid {uid}: not this run's" in str(refused.value)
    assert os.listdir(shared) == ["step-00000010"]


def _synced(tmp_path: Path, remote: Path, weights, *steps: int) -> None:
    old = tmp_path / "old-scratch"
    for step in steps:
        save(old, step, weights)
        without_blocking(Syncer(old, str(remote), EXPECTED, keep=5).sync_newest)


def test_a_damaged_checkpoint_is_never_set_aside_into_a_link(tmp_path, weights, victim):
    """On main quarantine/ was made with exist_ok: a link placed there took the damaged checkpoint, moved into the
    directory it points at, and its reason.txt written there. The checkpoint is left now, and the fetch goes on."""
    local, remote = tmp_path / "scratch", tmp_path / "remote"
    _synced(tmp_path, remote, weights, 10, 20)
    corrupt(remote / "step-00000020" / MODEL_FILE)
    os.symlink(victim, remote / QUARANTINE)
    logs: list[str] = []
    fetched = without_blocking(Syncer(local, str(remote), EXPECTED, log=logs.append).fetch_latest)
    assert fetched == local / "step-00000010"
    assert untouched(victim) and (remote / "step-00000020" / MODEL_FILE).is_file()
    assert any(f"not set aside: {remote}/{QUARANTINE} is a symbolic link to {victim}" in m for m in logs), logs


def test_another_users_invalid_checkpoint_is_neither_moved_nor_written_into(shared, tmp_path, weights):
    """On main fetch quarantined any invalid step directory: another user's was moved into quarantine/ and a
    reason.txt written into it. It is skipped now, left where and as it is."""
    local, uid = tmp_path / "scratch", second_user()[0]
    _synced(tmp_path, shared, weights, 10)
    sh_as_user(f"mkdir step-00000030 && echo '[[' > step-00000030/{MANIFEST}", cwd=shared)
    logs: list[str] = []
    assert without_blocking(Syncer(local, str(shared), EXPECTED, log=logs.append).fetch_latest) == \
        local / "step-00000010"
    assert os.listdir(shared / "step-00000030") == [MANIFEST] and not (shared / QUARANTINE).exists()
    assert any(f"{shared}/step-00000030 is a directory owned by uid {uid}: not made by this run" in m
               for m in logs), logs


def test_another_users_step_by_a_higher_name_neither_stops_the_sync_nor_is_resumed_from(shared, tmp_path, weights):
    """On main the newest step name on the remote won, whoever made it: another user's intact copy planted as
    step-99999990 was "newer" than every checkpoint of the run, so the sync pointed LATEST at it and never copied
    the run's own checkpoints again, and a resume fetched it. Only this user's step directories count now; the
    other is left, said once."""
    local, uid = tmp_path / "scratch", second_user()[0]
    _synced(tmp_path, shared, weights, 10)
    sh_as_user("cp -r step-00000010 step-99999990", cwd=shared)
    save(local, 20, weights)
    logs: list[str] = []
    syncer = Syncer(local, str(shared), EXPECTED, log=logs.append)
    for _ in range(2):
        without_blocking(syncer.sync_newest)
    assert (shared / LATEST).read_text().strip() == "step-00000020" and (shared / "step-00000020").is_dir(), logs
    assert sum("step-99999990 is a directory owned by" in m for m in logs) == 1, logs
    fresh = tmp_path / "fresh-scratch"
    assert without_blocking(Syncer(fresh, str(shared), EXPECTED).fetch_latest) == fresh / "step-00000020"
    assert os.lstat(shared / "step-99999990").st_uid == uid


@pytest.mark.parametrize("renames", ["renameat2", "NFS: no renameat2 flags"])
def test_a_run_as_root_on_a_root_squashed_share_deletes_its_own_old_checkpoints(tmp_path, weights, monkeypatch,
                                                                                 renames):
    """NFS's default root_squash makes what root writes the anonymous user's (nobody): a run as root in a container
    saw its own step directories as another user's and kept every one, filling the share. The owner the server
    gives this process's own directories counts as its own (learnt from the first one it makes), the claim
    dirfd's rename_new makes of a new name where renameat2's flags are missing too (Dir.owners)."""
    from faults_fixtures import mounted_faultfs, unavailable_fuse
    from minilmd.daemon.jobs import remote_write

    if (reason := unavailable_fuse()) or os.geteuid() != 0:
        pytest.skip(reason or "needs root: the share maps root to nobody")
    nobody = second_user()[0]
    monkeypatch.setattr(remote_write, "OWN_UIDS", perms.LearntOwners())  # what this process learns stays in this test
    if renames != "renameat2":
        monkeypatch.setattr(dirfd, "renameat2", lambda *args: False)  # as NFS's EINVAL
    backing, share, local = tmp_path / "backing", tmp_path / "share", tmp_path / "scratch"
    backing.mkdir()
    share.mkdir()
    logs: list[str] = []
    with mounted_faultfs(backing, share, squash_uid=nobody):
        syncer = Syncer(local, str(share), EXPECTED, keep=1, log=logs.append)
        for step in (10, 20):
            save(local, step, weights)
            without_blocking(syncer.sync_newest)
        assert os.lstat(share / "step-00000020").st_uid == nobody  # the share squashed it
        assert sorted(os.listdir(share)) == [LATEST, "step-00000020"], logs
        assert not [m for m in logs if "left as it is" in m], logs
