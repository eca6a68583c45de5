"""minilmd/mounts.py: /proc/self/mountinfo parsed (escapes, optional fields), a path's and a device's mount found,
and the one table of file-system kinds; then, as root, real mounts: a tmpfs under a directory whose name has a
space, a bind mount of it, and scratch's local-disk alternative refusing a FUSE file system."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from minilmd import mounts, perms
from minilmd.daemon.jobs import scratch_room

ROOT_EXT4 = b"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw"
DATA_NFS = b"30 22 0:50 /export /data rw,relatime shared:7 master:3 - nfs4 server:/export rw,vers=4.2"
FAST_TMPFS = b"31 30 0:51 / /data/fast rw - tmpfs tmpfs rw,size=1024k"
BIND_OF_ROOT = b"40 22 8:1 /srv/shared /home/u/shared rw,relatime shared:1 - ext4 /dev/sda1 rw"


def table(*lines: bytes) -> list[mounts.Mount]:
    return mounts.parse(b"\n".join(lines) + b"\n")


def test_a_mount_point_s_escaped_space_tab_newline_and_backslash_are_undone():
    line = rb"50 22 0:60 / /mnt/a\040b\011c\012d\134e rw - tmpfs my\040tmpfs rw"
    (m,) = table(line)
    assert (m.point, m.fstype, m.source, m.dev) == ("/mnt/a b\tc\nd\\e", "tmpfs", "my tmpfs", os.makedev(0, 60))


def test_a_name_that_is_not_utf8_compares_equal_to_the_same_name_from_the_file_system():
    (m,) = table(b"50 22 0:60 / /mnt/caf\xe9 rw - tmpfs tmpfs rw")
    assert m.point == os.fsdecode(b"/mnt/caf\xe9")


@pytest.mark.parametrize("optional", [b"", b" shared:1", b" shared:7 master:3 propagate_from:2 unbindable"])
def test_the_type_is_the_field_after_the_lone_dash_whatever_the_optional_fields(optional):
    (m,) = table(b"30 22 0:50 /export /data rw,relatime" + optional + b" - nfs4 server:/export rw,vers=4.2")
    assert (m.point, m.root, m.fstype, m.source) == ("/data", "/export", "nfs4", "server:/export")


def test_a_line_not_of_the_mountinfo_form_is_skipped_not_guessed():
    found = table(b"garbage", b"22 1 8:1 / / rw shared:1 ext4 /dev/sda1 rw", b"22 1 x:y / / rw - ext4 /dev/sda1 rw",
                  FAST_TMPFS)
    assert [m.point for m in found] == ["/data/fast"]


def test_a_path_under_a_nested_mount_is_on_the_innermost_one():
    found = table(ROOT_EXT4, DATA_NFS, FAST_TMPFS)
    where = {path: mounts.mount_at(path, found).fstype
             for path in ("/data/fast/run/x", "/data/fast", "/data/fastx", "/data", "/datax", "/")}
    assert where == {"/data/fast/run/x": "tmpfs", "/data/fast": "tmpfs", "/data/fastx": "nfs4", "/data": "nfs4",
                     "/datax": "ext4", "/": "ext4"}


def test_of_two_mounts_on_one_point_the_one_mounted_last_is_on_top():
    over = b"32 31 0:52 / /data/fast rw - ramfs ramfs rw"
    assert mounts.mount_at("/data/fast/x", table(ROOT_EXT4, DATA_NFS, FAST_TMPFS, over)).fstype == "ramfs"


def test_a_device_mounted_twice_is_the_mount_that_holds_the_path():
    found = table(ROOT_EXT4, DATA_NFS, BIND_OF_ROOT)
    dev = os.makedev(8, 1)
    assert mounts.mount_of_dev(dev, found, "/home/u/shared/run").point == "/home/u/shared"
    assert mounts.mount_of_dev(dev, found, "/home/u/other").point == "/"
    assert mounts.mount_of_dev(dev, found).point == "/"  # no path: the first listed
    assert mounts.mount_of_dev(dev, found, "/data/x").point == "/"  # the path is on another device: still dev's
    assert mounts.mount_of_dev(os.makedev(0, 99), found, "/data/x") is None


@pytest.mark.parametrize("fstype, kind", [
    ("ext4", mounts.LOCAL_DISK), ("xfs", mounts.LOCAL_DISK), ("overlay", mounts.LOCAL_DISK),
    ("tmpfs", mounts.RAM_DISK), ("ramfs", mounts.RAM_DISK),
    ("nfs", mounts.NETWORK), ("nfs4", mounts.NETWORK), ("cifs", mounts.NETWORK), ("smb3", mounts.NETWORK),
    ("ceph", mounts.NETWORK), ("lustre", mounts.NETWORK), ("gpfs", mounts.NETWORK), ("beegfs", mounts.NETWORK),
    ("fuse", mounts.NETWORK), ("fuseblk", mounts.NETWORK), ("fuse.sshfs", mounts.NETWORK),
    ("", mounts.UNKNOWN), ("squashfs", mounts.UNKNOWN), ("proc", mounts.UNKNOWN)])
def test_each_file_system_type_has_one_kind(fstype, kind):
    assert mounts.kind(fstype) == kind
    assert mounts.is_local(fstype) == (kind in (mounts.LOCAL_DISK, mounts.RAM_DISK))
    assert mounts.is_ram(fstype) == (kind == mounts.RAM_DISK)
    assert mounts.is_local_disk(fstype) == (kind == mounts.LOCAL_DISK)


def test_the_type_classes_do_not_overlap():
    classes = [mounts.LOCAL_DISK_TYPES, mounts.RAM_TYPES, mounts.NETWORK_TYPES]
    assert all(not (a & b) for i, a in enumerate(classes) for b in classes[i + 1:])
    assert mounts.LOCAL_TYPES == mounts.LOCAL_DISK_TYPES | mounts.RAM_TYPES


def test_mountinfo_is_read_whole_up_to_its_bound_and_not_at_all_past_it(tmp_path):
    text = tmp_path / "mountinfo"
    text.write_bytes(b"\n".join([ROOT_EXT4, DATA_NFS, FAST_TMPFS]) + b"\n")
    size = text.stat().st_size
    assert [m.point for m in mounts.read_mounts(str(text), max_bytes=size)] == ["/", "/data", "/data/fast"]
    assert mounts.read_mounts(str(text), max_bytes=size - 1) == []  # never a truncated table: no mount known
    assert mounts.read_mounts(str(tmp_path / "absent")) == []


def test_this_process_s_root_is_found_in_the_real_mountinfo():
    found = mounts.mount_of("/")  # its device may be in no mount (a btrfs subvolume): then by its path
    assert found is not None and found.point == "/" and found.fstype


# ---- real mounts (root) ----

def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mount {' '.join(args)} failed here: {done.stderr.strip()}")


@pytest.fixture
def spaced_tmpfs(tmp_path):
    """A 1 MiB tmpfs at <tmp>/"a dir\\with space" and a bind mount of it at <tmp>/"its bind"; unmounted after."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root to mount a tmpfs (euid {os.geteuid()})")
    point, bind = tmp_path / "a dir\\with space", tmp_path / "its bind"
    point.mkdir()
    bind.mkdir()
    mounted = []
    try:
        _mount("-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(point))
        mounted.append(point)
        (point / "sub").mkdir()
        _mount("--bind", str(point / "sub"), str(bind))
        mounted.append(bind)
        yield point, bind
    finally:
        for where in reversed(mounted):
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_tmpfs_under_a_directory_with_a_space_is_found_with_its_type(spaced_tmpfs):
    point, _ = spaced_tmpfs
    found = mounts.mount_of(point / "sub")
    assert found is not None and (found.point, found.fstype) == (str(point.resolve()), "tmpfs")
    assert scratch_room._mount_of(point / "sub") == (str(point.resolve()), "tmpfs")
    assert perms.local_fs(os.stat(point).st_dev)


def test_a_bind_mount_is_its_own_mount_of_the_same_device(spaced_tmpfs):
    point, bind = spaced_tmpfs
    found = mounts.mount_of(bind)
    assert found is not None and (found.point, found.root, found.fstype) == (str(bind.resolve()), "/sub", "tmpfs")
    assert found.dev == os.stat(point).st_dev


def test_scratch_never_suggests_a_fuse_file_system_as_a_local_disk(faultfs):
    """/var/tmp, the first place scratch suggests, is a FUSE mount in a mount namespace of the test's own; before,
    every type but tmpfs, ramfs, nfs and nfs4 counted as a local disk, and /var/tmp on FUSE was suggested."""
    if shutil.which("unshare") is None or shutil.which("findmnt") is None:
        pytest.skip("needs util-linux's unshare and findmnt")
    code = ("from pathlib import Path; from minilmd.daemon.jobs.scratch_room import _alternative_scratch; "
            "print(_alternative_scratch(Path('s'), 1))")
    script = 'mount --bind "$1" /var/tmp && findmnt -no FSTYPE -T /var/tmp && exec "$2" -c "$3"'
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                           str(faultfs.root), sys.executable, code], capture_output=True, text=True)
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"no mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    fstype, suggested = done.stdout.splitlines()
    assert fstype.startswith("fuse")  # the namespace's /var/tmp is the FUSE mount
    assert not suggested.startswith("/var/tmp/"), suggested


def test_an_nfs_mounts_server_address_is_read_from_its_super_options():
    (by_name, tmpfs) = table(b"30 22 0:50 / /data rw - nfs4 nfs.example:/export rw,vers=4.2,clientaddr=10.0.0.2,"
                             b"local_lock=none,addr=10.0.0.5", FAST_TMPFS)
    assert by_name.server_address() == "10.0.0.5" and by_name.options.startswith("rw,vers=4.2")
    assert tmpfs.server_address() == ""  # not NFS
    assert mounts.Mount("/d", "nfs", 1, options="rw") == mounts.Mount("/d", "nfs", 1)  # options: no part of a mount
