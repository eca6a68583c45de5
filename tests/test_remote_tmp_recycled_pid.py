"""A sync's temporary names on the remote record its maker's start time, so that the next sync's clean-up tells a
dead maker from a process that got its pid since (pid_max is 32768 on many hosts: a pid is recycled within hours
under load). Before, `.tmp-step-XXXXXXXX-<host>-<pid>` recorded the pid only: a recycled pid was taken for the
killed sync still running and its half copy left for good (a loaded test run left `.tmp-step-00000010-vm-31377`).
An older minilmd's name, without a start time, is still read as before: any live process of its pid keeps it.

The names record the boot too (`-boot<first 8 hex digits of the boot id>`): a sync started at boot by a service gets
much the same pid and start time each boot, so a half copy cut by a reboot could match a live process of the new boot
and be kept for good. A name of another boot names no live maker; the same name with this boot's tag is the control.
A name without a boot (an older minilmd's) is judged by pid and start time as before."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs
from minilmd import names as n
from minilmd import tmpnames as tn
from minilmd.daemon.jobs import remote_made
from minilmd.daemon.jobs.remote_local import LocalRemote, open_remote
from minilmd.daemon.jobs.sync import Syncer
from minilmd.proc_info import boot_tag, process_start_ticks
from sync_helpers import EXPECTED, KILL_MID_SYNC, dirs, names, save, weights  # noqa: F401 - dirs, weights: fixtures


def _zombie_start_ticks(pid: int) -> int:
    """The start time of our exited, not yet reaped child (os.waitid's WNOWAIT): its /proc entry still says it."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def test_a_killed_syncs_half_copy_records_its_pid_and_start_time(dirs, weights):
    local, remote = dirs
    save(local, 10, weights)
    child = subprocess.Popen([sys.executable, "-c", KILL_MID_SYNC, str(local), str(remote), "2"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, its pid not free yet: its start time readable
    ticks = _zombie_start_ticks(child.pid)
    assert child.wait() == -9
    left = [name for name in names(remote) if name.startswith(".tmp-step-00000010")]
    assert [tn.remote_tmp_maker(name, tn.host_tag()) for name in left] == [(child.pid, ticks, boot_tag())]
    assert boot_tag()  # the names record this boot: a kernel that gives none would make the boot tests below moot


@pytest.fixture
def other_process():
    """A live process that is not a sync: what holds a dead sync's pid once the kernel has given it out again."""
    with subprocess.Popen(["sleep", "600"]) as proc:
        try:
            yield proc.pid, process_start_ticks(proc.pid)
        finally:
            proc.kill()


ANOTHER_BOOT = "00000000"
"""A boot tag of no boot of this test's (the kernel's boot ids are random: this one's first 8 digits are not 0s)."""


def _left_by_a_killed_sync(local: Path, remote: Path, pid: int, ticks: int | None, boot: str = "") -> Path:
    """The half copy of step 20 a sync of this run made as (pid, ticks) in boot `boot` and was killed in (its run's
    record holds it: the next sync's to remove once its maker is proven gone)."""
    killed = Syncer(local, str(remote), EXPECTED)
    left = remote / killed.remote.make_tmp(tn.sync_tmp_name("step-00000020", tn.host_tag(), pid, ticks, boot))
    (left / "model.safetensors").write_bytes(b"half")
    return left


def test_a_dead_syncs_half_copy_whose_pid_another_process_holds_now_is_removed(dirs, weights, other_process):
    local, remote = dirs
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED).sync_newest()
    pid, ticks = other_process
    left = _left_by_a_killed_sync(local, remote, pid, ticks - 1)  # its maker started before the pid's holder now
    save(local, 20, weights)
    assert Syncer(local, str(remote), EXPECTED).sync_newest().step == 20
    assert not left.exists()  # was: left for good, its pid alive
    assert names(remote) == ["LATEST", "step-00000010", "step-00000020"]


def test_the_half_copy_of_a_live_maker_is_left(dirs, weights, other_process):
    local, remote = dirs
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED).sync_newest()
    pid, ticks = other_process
    live = _left_by_a_killed_sync(local, remote, pid, ticks, boot_tag())  # the very process: a copy in progress
    older = _left_by_a_killed_sync(local, remote, pid, None)  # an older minilmd's name: whose, cannot be told
    Syncer(local, str(remote), EXPECTED).sync_newest()
    assert live.is_dir() and older.is_dir()
    assert checkpoint_dirs.read_latest(remote) == "step-00000010"


@pytest.mark.parametrize(("boot", "kept"), [(ANOTHER_BOOT, False), ("this", True), ("", True)])
def test_a_half_copy_of_another_boot_is_removed_though_a_live_process_has_its_pid_and_start_time(
        dirs, weights, other_process, boot, kept):
    """A sync cut by a reboot, its pid and start time those of a live process of the new boot (here: the very
    values of one): removed by the next sync. The same name with this boot's tag (the control) or with none (an
    older minilmd's) names that live process: left."""
    local, remote = dirs
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED).sync_newest()
    pid, ticks = other_process
    left = _left_by_a_killed_sync(local, remote, pid, ticks, boot_tag() if boot == "this" else boot)
    save(local, 20, weights)
    assert Syncer(local, str(remote), EXPECTED).sync_newest().step == 20
    assert left.is_dir() == kept
    assert tn.remote_tmp_maker(left.name, tn.host_tag())[:2] == (pid, ticks)


@pytest.mark.parametrize(("ahead", "boot", "kept"), [(-1, "", False), (0, "", True), (0, ANOTHER_BOOT, False),
                                                    (0, "this", True)])
def test_on_a_remounted_fuse_share_a_recycled_pid_proves_no_live_sync(tmp_path, other_process, ahead, boot, kept):
    """remote_made's proof of a half copy by its recorded name (a FUSE remount renumbered its inode) asks the same:
    a process of its pid that started at another time, or in another boot, is no sync of it still running."""
    root = tmp_path / "remote"
    remote = open_remote(str(root))
    assert isinstance(remote, LocalRemote)
    remote.made = remote_made.Made(tmp_path / "remote-made.json")
    remote.makedirs()
    remote.made.set_root({"url": str(root), "dev": 1, "ino": 1, "fstype": "fuse", "source": "share",
                          "point": str(root), "under": "."})
    pid, ticks = other_process
    name = remote.make_tmp(tn.sync_tmp_name(n.step_name(30), tn.host_tag(), pid, ticks + ahead,
                                           boot_tag() if boot == "this" else boot))
    (root / name / "model.safetensors").write_bytes(b"half")
    shutil.copytree(root / name, root / "renumbered")  # a remount's new inode under the recorded name
    shutil.rmtree(root / name)
    os.rename(root / "renumbered", root / name)
    why = remote.rm(name)
    assert (root / name).is_dir() == kept, why
