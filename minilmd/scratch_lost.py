"""Whether a finished run's scratch checkpoints, its only copy (it had no run.remote), are known to be gone for good:
the one case where a later stage waiting for them (init.from naming that run) should not wait
(minilmd/init_source.py), and `status` should not say they may be lost (daemon/views/status.py).

Usually a missing place is an outage to wait out: a share not mounted reads as gone or as its empty stub
(minilmd/shared_place.py). A scratch is no share: /dev/shm, or a local disk, is emptied by a reboot, a scratch
cleaner or an `rm -r`, and nothing brings it back. Known so only when all of these hold (`lost_for_good`):
- the nearest directory above the checkpoint directory that is there (the checkpoint directory itself, when it is
  there and empty) is on a local file system (a local disk or a RAM disk: minilmd/mounts.py), never a network or
  FUSE one, nor one of a type not known;
- neither it nor any directory between it and the checkpoint directory is where this machine is set up to mount a
  share (minilmd/mount_places.py: fstab, autofs, systemd units, a root-owned stub in a mount parent);
- an ancestor standing in for the missing directory holds entries, or is itself a mounted file system's root: an
  empty directory that is neither is what an unmounted share mounted by hand leaves, which no table names.
Nothing is opened but the directories' listings (their first entry), nothing followed beyond the path as named.
And never for a run whose supervisor ran on another host (`other_host`: the host its state.json names): a scratch
is its node's own /dev/shm or local disk, so the path means another directory there, which no look from here can
judge; the checkpoints may be there, in a run trained on a cluster node. That is said (`elsewhere_words`), and the
stage waits, as for an outage, rather than a final "gone for good (a reboot ...)" (review11b).
Torch-free.
"""
from __future__ import annotations

import os
import socket

from minilmd.untrusted import holds_any, printable


def other_host(host: object) -> str | None:
    """`host` (a state.json's supervisor host), shown, when it names a host that is not this one; None for this
    host's or an unknown one (no name: judged here, as before)."""
    if not isinstance(host, str) or not host or host == socket.gethostname():
        return None
    return printable(host)[:80]


def elsewhere_words(run: str, checkpoint_dir: str | os.PathLike, host: str) -> str:
    """What a stage waiting for a finished run's scratch-only checkpoints is told when that run ran on `host`."""
    return (f"the run {run} has finished on host {host}, with no run.remote: its checkpoints are in that host's "
            f"scratch ({checkpoint_dir}), which this host cannot see; run this stage on {host} (or copy them to a "
            f"share this host reads and point init.from there)")


def lost_for_good(checkpoint_dir: str | os.PathLike, trained_on: object = None) -> bool:
    """Whether `checkpoint_dir` (a finished run's scratch checkpoints, missing or empty) is gone for good, not a
    share that may come back (the module docstring); False whenever that is not known, and for a run whose
    supervisor ran on another host (`trained_on`: its state.json's supervisor host; other_host)."""
    from minilmd import mount_places, mounts

    if other_host(trained_on) is not None:
        return False

    path = os.path.abspath(os.fspath(checkpoint_dir))
    there = path
    try:
        while not os.path.isdir(there):
            if os.path.lexists(there) or there == os.path.dirname(there):
                return False  # a file, a link to nowhere where the directory was: not a plain removal
            there = os.path.dirname(there)
        mount = mounts.mount_of(there)
        if mount is None or not mounts.is_local(mount.fstype):
            return False
        config = mount_places.snapshot()
        step = path
        while True:
            if config.is_stub(step):
                return False
            if step == there:
                break
            step = os.path.dirname(step)
        if there == path:
            return not holds_any(path)  # the checkpoint directory itself, there and empty: emptied
        return holds_any(there) or os.path.realpath(there) == mount.point
    except OSError:
        return False
