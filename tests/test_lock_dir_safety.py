"""gpu.lock_dir is used only when no other user can rearrange it: root's or ours, and every directory above it
root's or ours (sticky where others may write). Each attack below let the other user (nobody, a real Unix user
through setpriv) unlink a lease, so that two runs took one GPU; now no lease is taken through it: every device is
busy, saying why, and `run --check` says the run waits for it (never exit 2, which would end the run for good).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from fakes_nvml import FREE, FakeNvml
from minilmd.config import GpuSection, load_config
from minilmd.daemon import preflight
from minilmd.daemon.host import leases
from minilmd.daemon.host.gpu import GpuAdmission, open_nvml_or_reason
from minilmd.daemon.host.gpuwaits import lock_dir_wait
from second_user import sh_as_user as as_nobody
from second_user import shared  # noqa: F401 - a fixture
from supervisor_helpers import write_config

pytestmark = pytest.mark.root


def refused(lock_dir: Path) -> str:
    """Why root's run cannot lease the one free device through lock_dir (it must not)."""
    adm = GpuAdmission(FakeNvml([[FREE]]), GpuSection(lock_dir=str(lock_dir), stable_polls=1), run_name="victim")
    lease = adm.try_acquire(1)
    if lease is not None:
        lease.release()
        pytest.fail(f"leased through {lock_dir}, which another user can rearrange")
    reasons = " ".join(adm.last_report.devices[0].reasons)
    assert reasons.startswith("lease not taken safely") and reasons == f"lease not taken safely: " \
        f"{leases.lock_dir_problem(lock_dir)}", reasons
    return reasons


def test_a_sticky_lock_dir_another_user_made_first_is_refused(shared):
    as_nobody("mkdir -m 1777 locks", shared)  # anyone can make /tmp/minilmd-gpu-locks first
    said = refused(shared / "locks")  # the place rule's words (minilmd/place_rule.py), as for every shared place
    assert "belongs to user nobody (uid 65534), who could replace the lease files" in said, said
    assert "(sticky or not: its owner may remove or rename anything in it)" in said, said
    assert list((shared / "locks").iterdir()) == []  # no lease file made in there


def test_a_lock_dir_inside_a_directory_another_user_owns_is_refused(shared):
    as_nobody("mkdir -m 0755 his", shared)
    (shared / "his" / "locks").mkdir()
    (shared / "his" / "locks").chmod(0o1777)  # root's and sticky, but nobody can rename it away and put his own
    said = refused(shared / "his" / "locks")
    assert f"the directory {shared}/his above it belongs to user nobody (uid 65534), who could replace the lease " \
           "files" in said, said


def test_a_lock_dir_inside_a_world_writable_directory_that_is_not_sticky_is_refused(shared):
    (shared / "open" / "locks").mkdir(parents=True)
    (shared / "open").chmod(0o777)
    (shared / "open" / "locks").chmod(0o1777)
    assert f"{shared}/open above it can be written by other users (mode 777, not sticky)" in \
        refused(shared / "open" / "locks")
    (shared / "open").chmod(0o1777)  # sticky and root's, like /tmp: fine
    assert leases.lock_dir_problem(shared / "open" / "locks") is None


def test_a_symlink_of_another_user_on_the_way_is_refused(shared):
    (shared / "real" / "locks").mkdir(parents=True)
    (shared / "real" / "locks").chmod(0o1777)
    as_nobody("ln -s real link", shared)  # nobody can point it elsewhere at any time
    assert f"{shared}/link is a symbolic link of user nobody (uid 65534) (to real): minilmd follows no link of " \
           "another user's" in refused(shared / "link" / "locks")
    (shared / "mine").symlink_to(shared / "real")  # root's own link to a safe place: fine
    assert leases.lock_dir_problem(shared / "mine" / "locks") is None


def test_the_admins_lock_dir_and_a_missing_one_under_safe_parents_are_accepted(shared):
    (shared / "locks").mkdir()
    (shared / "locks").chmod(0o1777)
    assert leases.lock_dir_problem(shared / "locks") is None
    assert leases.lock_dir_problem(shared / "not-yet" / "locks") is None  # made at the first lease


def test_run_check_says_the_run_waits_for_an_unsafe_lock_dir_only_where_it_leases(shared, tmp_path, corpus):
    """Not exit 2 (final for systemd and the tmux launcher: one mkdir by anyone ended every user's GPU run for
    good, hostile audit 6 F4): a wait, said by `run --check`; tests/test_lock_dir_squat.py runs it to its end."""
    as_nobody("mkdir -m 1777 locks", shared)
    config = write_config(tmp_path, corpus, remote=False, train={"device": "cuda"},
                          gpu={"lock_dir": str(shared / "locks")})
    wait = lock_dir_wait(load_config(config))
    assert wait is not None and wait.startswith("gpu.lock_dir: the lock directory ") and \
        f"{shared / 'locks'} belongs to user nobody" in wait and "the run waits in waiting_gpu" in wait, wait
    for device in ("cpu",) + (("auto",) if isinstance(open_nvml_or_reason(), str) else ()):
        assert lock_dir_wait(load_config(config, [f"train.device=\"{device}\""])) is None  # no lease taken
        cfg_waits = preflight.check_with_waits(str(config), [f"train.device=\"{device}\""])[1]
        assert not any(w.startswith("gpu.lock_dir") for w in cfg_waits)  # nothing to wait for


class ClosableNvml(FakeNvml):
    """FakeNvml as open_nvml_or_reason gives NVML to `run --check`: closed after its look."""

    def close(self) -> None:
        pass


def test_run_check_says_the_wait_for_a_lease_file_no_run_can_use(shared, tmp_path, corpus, monkeypatch):
    """A lease file that is not one (here a FIFO of another user's, in the admin's lock directory) keeps its card
    busy for this run, saying why, until it is removed: `run --check` says that wait, per card, in the words of the
    wait's reason (exit 0), and nothing is made or locked in the lock directory."""
    import os

    from minilmd.daemon.host import gpu, gpuwaits

    locks = shared / "locks"
    locks.mkdir()
    locks.chmod(0o1777)
    as_nobody("mkfifo -m 0600 locks/gpu-GPU-fake-0001.lock", shared)
    for module in (gpu, gpuwaits):  # the device check's NVML and the lease files' look
        monkeypatch.setattr(module, "open_nvml_or_reason", lambda: ClosableNvml([[FREE], [FREE]]))
    config = write_config(tmp_path, corpus, remote=False, train={"device": "cuda"}, gpu={"lock_dir": str(locks)})
    waits = [w for w in preflight.check_with_waits(str(config))[1] if w.startswith("gpu.lock_dir")]
    assert len(waits) == 1 and waits[0].startswith(f"gpu.lock_dir: GPU 1 (Fake GPU 1): lease not taken safely: "
                                                   f"{locks}/gpu-GPU-fake-0001.lock (of user nobody (uid 65534)) "
                                                   "is not a regular file; remove it, or set gpu.lock_dir"), waits
    # the lock directory is root's (its owner may remove anything in it, sticky or not): "remove it", not "ask"
    assert "the run waits in waiting_gpu" in waits[0], waits
    assert os.listdir(locks) == ["gpu-GPU-fake-0001.lock"]  # card 0's lease file not made by the check
    assert not [w for w in preflight.check_with_waits(str(config), ['train.device="cpu"'])[1]
                if w.startswith("gpu.lock_dir")]  # no lease taken: nothing to wait for


def test_a_missing_lock_dir_and_its_parents_made_under_the_private_policy_stay_reachable_by_every_user(shared):
    """The run's private umask (minilmd/perms.py) would make the missing parents 0700: nobody else's run could
    reach the lock directory through them."""
    import os

    old = os.umask(0o077)
    try:
        lease = leases.open_lease(shared / "not-yet" / "deeper" / "locks", "GPU-a")
        lease.close()
    finally:
        os.umask(old)
    for directory in (shared / "not-yet", shared / "not-yet" / "deeper"):
        assert directory.stat().st_mode & 0o777 == 0o755, directory
    names = [p.name for p in (shared / "not-yet" / "deeper" / "locks").iterdir()]
    assert len(names) == 1
    as_nobody(f"test -r not-yet/deeper/locks/{names[0]}", shared)  # another user reaches the lease (or raises)


def test_no_lock_directory_is_made_through_a_link_planted_on_the_way_after_the_check(shared, tmp_path, monkeypatch):
    """gpu.lock_dir = SHARED/race/locks with `race` missing (the rule allows it: SHARED is sticky, like /tmp). The
    lease's open checked that chain by path, then made the missing directories by path: nobody's link planted at
    `race` between the check and the mkdir put the lock directory, 1777, and root's lease file into her private
    directory. Here the link appears at the first mkdir, the moment his loop hit. Now the place rule's walk makes
    each directory at its judged parent's descriptor and meets his link: refused, nothing made through it."""
    import os

    hers = tmp_path / "hers"
    hers.mkdir(mode=0o700)
    real_mkdir, planted = os.mkdir, []

    def plant_then_mkdir(*args, **kwargs):
        if not planted:
            as_nobody(f"ln -s {hers} race", shared)
            planted.append(True)
        return real_mkdir(*args, **kwargs)

    assert leases.lock_dir_problem(shared / "race" / "locks") is None  # what run --check and the launch saw
    monkeypatch.setattr(os, "mkdir", plant_then_mkdir)
    with pytest.raises(leases.LeaseUnsafe, match=f"{shared}/race is a symbolic link of user nobody"):
        leases.open_lease(shared / "race" / "locks", "GPU-a")
    monkeypatch.undo()
    assert planted and list(hers.iterdir()) == []  # no lock directory, no lease file in her directory
    assert (shared / "race").is_symlink()  # his link: left as it is


def admin_lock_dir_at(path: Path) -> Path:
    path.mkdir()
    path.chmod(0o1777)
    return path


def test_the_lock_directory_as_a_link_is_followed_only_when_root_made_it(shared):
    """The place rule for its last component too: a link of root's (or ours) is followed to a directory the same
    rule holds (before: refused as "a symbolic link", while the same link above it was followed); another user's
    link is refused and nothing is made where it leads."""
    real = admin_lock_dir_at(shared / "real")
    (shared / "mine").symlink_to(real)
    lease = leases.open_lease(shared / "mine", "GPU-a")
    lease.close()
    assert [p.name for p in real.iterdir()] == ["GPU-a"]
    theirs = admin_lock_dir_at(shared / "elsewhere")
    as_nobody(f"ln -s {theirs} his", shared)
    assert f"is a symbolic link of user nobody (uid 65534) (to {theirs})" in refused(shared / "his")
    assert list(theirs.iterdir()) == []
