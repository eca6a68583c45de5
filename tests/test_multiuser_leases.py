"""GPU leases between two real Unix users (root and nobody) sharing one lock directory, and the attacks on it;
and the same attack on the run lock of a run directory another user can write into.

The lock directory is shared by every user's runs on the machine, so whoever comes first makes it, and another
user may have made it, with anything inside: a symlink named like a lease file pointing at a file of ours, a
FIFO, a directory that is not sticky. A run never follows, chmods, truncates or writes such a file; it says why
the device cannot be leased safely; and two users never hold one device.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from lease_helpers import LEASE, admin_lock_dir, admission, first_line, nobody_running
from minilmd.daemon.host.lock import LockUnsafe, RunLock, lock_holder
from second_user import (
    second_user,
    shared,  # noqa: F401 - a fixture
    user_python,
    )
from second_user import sh_as_user as as_nobody

pytestmark = pytest.mark.root

OTHER = 64123
"""A third uid with no user behind it (neither root nor nobody): the owner of a lease file in the tests below."""


def precious(shared: Path) -> Path:
    victim = shared / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    return victim


def assert_untouched(victim: Path) -> None:
    st = victim.stat()
    assert victim.read_text() == "precious\n" and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0


def test_a_symlink_planted_as_a_lease_file_is_not_followed(shared):
    victim = precious(shared)
    admin_lock_dir(shared)
    as_nobody(f"ln -s {victim} locks/{LEASE}", shared)
    adm = admission(shared / "locks")
    assert adm.try_acquire(1) is None
    reasons = " ".join(adm.last_report.devices[0].reasons)
    assert "lease not taken safely" in reasons and "symbolic link" in reasons, reasons
    assert "symbolic link" in adm.last_report.summary()
    assert_untouched(victim)
    assert (shared / "locks" / LEASE).is_symlink()  # another user's file: left as it is


@pytest.mark.parametrize("mode", ["0755", "0777"])
def test_a_lock_directory_another_user_can_rearrange_is_refused(shared, mode):
    victim = precious(shared)
    as_nobody(f"mkdir -m {mode} locks && ln -s {victim} locks/{LEASE}", shared)
    adm = admission(shared / "locks")
    assert adm.try_acquire(1) is None
    reasons = " ".join(adm.last_report.devices[0].reasons)
    assert "lease not taken safely" in reasons and "belongs to user nobody (uid 65534)" in reasons, reasons
    assert_untouched(victim)
    assert sorted(p.name for p in (shared / "locks").iterdir()) == [LEASE]  # nothing made in there


def test_a_fifo_planted_as_a_lease_file_neither_blocks_nor_is_chmodded(shared):
    admin_lock_dir(shared)
    as_nobody(f"mkfifo -m 0600 locks/{LEASE}", shared)
    adm = admission(shared / "locks")
    assert adm.try_acquire(1) is None
    assert "not a regular file" in " ".join(adm.last_report.devices[0].reasons)
    st = (shared / "locks" / LEASE).lstat()
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


def test_a_hard_link_to_another_file_is_not_taken_for_a_lease_file(tmp_path):
    """A second name of some file (a hard link needs no write permission on its target where
    fs.protected_hardlinks is off) is refused like a symlink: fstat's link count says so."""
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o1777)
    locks.chmod(0o1777)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    os.link(victim, locks / LEASE)
    adm = admission(locks)
    assert adm.try_acquire(1) is None
    assert "2 hard links" in " ".join(adm.last_report.devices[0].reasons)
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600


LOOK = textwrap.dedent("""
    import json, sys
    from fakes_nvml import FakeNvml, FREE
    from minilmd.config import GpuSection
    from minilmd.daemon.host.gpu import GpuAdmission
    from minilmd.daemon.host.gpuwaits import unfit_lease_files
    gpu = GpuSection(lock_dir=sys.argv[1], stable_polls=1)
    adm = GpuAdmission(FakeNvml([[FREE]]), gpu, run_name="nobody-run")
    lease = adm.try_acquire(1)
    report = adm.last_report
    print(json.dumps({"leased": lease is not None, "summary": report.summary(),
                      "reasons": report.to_dict()["devices"][0]["reasons"],
                      "check": unfit_lease_files(FakeNvml([[FREE]]), gpu.lock_dir)}))
""")


def nobody_looks(locks: Path) -> dict:
    """What nobody's run sees of FakeNvml's one free card through `locks`: whether it leased it, its poll's summary
    (`status`, the supervisor's `gpu` event), the card's reasons (state.json's gpu_wait) and `run --check`'s waits
    about the lease files."""
    done = subprocess.run(user_python(LOOK, str(locks)), capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_another_users_lease_file_that_no_other_user_can_read_is_named_not_called_busy(shared):
    """The owner of a lease file (OTHER: his run leased card 0 once and ended) chmods it 600: no other user's run
    can open it, so none can flock it, nor lease the card through it. The card was "busy" for ever, and the reason
    named the lock directory ("lease not taken: D: Permission denied"), neither the file nor its owner. Now the
    file is named as what it is: its path, its owner, its mode, and who can remove it; the wait goes on (as for a
    FIFO or a link planted there) until its owner or an admin removes it, and `run --check` says so."""
    locks = admin_lock_dir(shared)
    lease = locks / LEASE
    lease.write_bytes(b"")
    os.chown(lease, OTHER, OTHER)
    lease.chmod(0o600)
    said = nobody_looks(locks)
    assert not said["leased"]
    words = f"{lease} (of uid {OTHER}) has mode 600, which your runs cannot open"
    way_out = f"ask uid {OTHER} or an admin to remove it"
    reasons = " ".join(said["reasons"])
    assert reasons.startswith("lease not taken safely: ") and words in reasons and way_out in reasons, reasons
    assert "Permission denied" not in reasons, reasons
    assert words in said["summary"], said["summary"]
    check = " ".join(said["check"])
    assert len(said["check"]) == 1 and check.startswith("gpu.lock_dir: GPU 0 (Fake GPU 0): ") and words in check \
        and way_out in check and "waiting_gpu" in check, said["check"]
    st = lease.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (OTHER, 0o600)  # his: left as it is
    os.unlink(lease)  # his owner (or an admin) removes it: the next run leases
    said = nobody_looks(locks)
    assert said["leased"] and said["check"] == [], said


def test_the_first_user_makes_the_directory_shared_and_its_lease_readable_whatever_its_umask(tmp_path):
    old = os.umask(0o077)
    try:
        lease = admission(tmp_path / "locks").try_acquire(1)
    finally:
        os.umask(old)
    assert lease is not None
    try:
        assert stat.S_IMODE((tmp_path / "locks").stat().st_mode) == 0o1777
        assert stat.S_IMODE((tmp_path / "locks" / LEASE).stat().st_mode) == 0o644
    finally:
        lease.release()
    assert (tmp_path / "locks" / LEASE).read_bytes() == b""  # our own file: emptied at release


def test_two_users_never_hold_one_device_and_neither_writes_the_others_lease(shared):
    uid, _ = second_user()
    locks = admin_lock_dir(shared)
    with nobody_running(locks, "nobody-run", hold=True) as holder:  # nobody comes first: it makes the lease file
        assert first_line(holder) == "leased"
        st_file = (locks / LEASE).stat()
        assert st_file.st_uid == uid and stat.S_IMODE(st_file.st_mode) == 0o644
        adm = admission(locks, "root-run")
        assert adm.try_acquire(1) is None
        assert f"leased by run nobody-run pid {holder.pid}" in adm.last_report.summary()
    body = (locks / LEASE).read_bytes()
    lease = adm.try_acquire(1)  # the holder died: root takes the device, through nobody's file
    assert lease is not None
    try:
        with nobody_running(locks, "nobody-again") as refused:
            line = first_line(refused)
            assert line.startswith("refused") and f"leased by pid {os.getpid()} (user root (uid 0))" in line, line
    finally:
        lease.release()
    after = (locks / LEASE).stat()
    assert (locks / LEASE).read_bytes() == body  # never written, never truncated by root
    assert after.st_uid == uid and stat.S_IMODE(after.st_mode) == 0o644  # never chmodded
    with nobody_running(locks, "nobody-last") as again:
        assert first_line(again) == "leased"  # root let it go


def test_a_lock_directory_root_made_first_serves_the_other_user(shared):
    locks = shared / "locks"
    lease = admission(locks, "root-run").try_acquire(1)
    assert lease is not None
    st_dir = locks.stat()
    assert st_dir.st_uid == 0 and stat.S_IMODE(st_dir.st_mode) == 0o1777
    try:
        with nobody_running(locks, "nobody-run") as refused:
            line = first_line(refused)
            assert line.startswith("refused") and f"leased by run root-run pid {os.getpid()}" in line, line
    finally:
        lease.release()
    with nobody_running(locks, "nobody-run", hold=True) as taken:
        assert first_line(taken) == "leased"
        assert admission(locks, "root-again").try_acquire(1) is None


def test_a_symlink_planted_as_the_run_lock_is_not_followed(shared):
    victim = precious(shared)
    as_nobody(f"mkdir -m 0777 run && ln -s {victim} run/supervisor.lock", shared)  # a run dir others can write
    with pytest.raises(LockUnsafe, match="symbolic link"):
        RunLock(shared / "run").acquire()
    assert lock_holder(shared / "run") is None
    assert_untouched(victim)


def test_another_users_file_as_the_run_lock_is_not_written(shared):
    as_nobody("mkdir -m 0777 run && echo theirs > run/supervisor.lock", shared)
    with pytest.raises(LockUnsafe, match="belongs to uid"):
        RunLock(shared / "run").acquire()
    assert (shared / "run" / "supervisor.lock").read_text() == "theirs\n"
