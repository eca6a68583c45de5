"""What /proc/self/mountinfo lists, for the rule that nothing is made or written on a configured mount point nothing
is mounted on (minilmd/mount_places.py unmounted_point): a fake of the kernel's list with a share mounted on a
directory (`mounted_on`, for any user), and a real tmpfs mounted on one (`tmpfs_on`, root only)."""
from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import tempfile
from pathlib import Path

from minilmd import mounts

KERNELS = mounts.MOUNTINFO
"""The kernel's own list, which each fake extends (a later fake replaces an earlier one)."""


def mounted_on(monkeypatch, tmp_path: Path, *points: Path, fstype: str = "nfs4") -> None:
    """mountinfo as it reads with a share of `fstype` mounted on each of `points` (no space in them), besides this
    machine's own mounts: these alone, whatever an earlier call gave."""
    lines = "".join(f"{900 + i} 1 0:{200 + i} / {p} rw,relatime - {fstype} nas:/x{i} rw\n"
                    for i, p in enumerate(points))
    fake = tmp_path / f"mountinfo-{len(list(tmp_path.glob('mountinfo-*')))}"
    fake.write_bytes(Path(KERNELS).read_bytes() + lines.encode())
    monkeypatch.setattr(mounts, "MOUNTINFO", str(fake))


@contextlib.contextmanager
def tmpfs_on(point: Path):
    """A real tmpfs mounted on `point` for the block (root only), unmounted after it."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "minilmd-test", str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=True)


@functools.cache
def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root, with the right to mount in its namespace)."""
    if os.geteuid() != 0:
        return False
    with tempfile.TemporaryDirectory() as probe:
        try:
            tried = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "minilmd-test", probe],
                                   capture_output=True)
        except OSError:
            return False
        if tried.returncode != 0:
            return False
        subprocess.run(["umount", probe], check=True)
    return True
