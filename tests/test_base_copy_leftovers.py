"""What a push of the LoRA base (daemon/jobs/basecopy.py) leaves when another machine publishes its own base's copy
at `<remote>/init` after the push read the record there: on a local remote, a push killed while it looks at what
stood at `init` (moved under its own temporary name: Remote.publish_unless_taken) leaves that copy there, and the
next sync's clean-up of dead pids' temporary names quarantines it instead of deleting it; on a store without rename
(memory://) the push reads the record again just before it removes what stands at `init`."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import fsspec
import pytest

from base_copy_helpers import files_of, staged_pth
from minilmd import tmpnames
from minilmd.daemon.jobs import basecopy, remote_made
from minilmd.daemon.jobs.remote import Remote
from minilmd.daemon.jobs.remote_local import open_remote
from minilmd.daemon.jobs.sync import STALE_TMP_SECONDS, Syncer
from minilmd.init_source import STAGED_PTH, STAGED_RECORD
from minilmd.names import QUARANTINE, REASON_FILE
from minilmd.tmpnames import sync_tmp_name

KILLED_WHILE_LOOKING = textwrap.dedent("""
    import os, shutil, signal, sys
    from pathlib import Path
    from minilmd import dirfd, fsio
    from minilmd.daemon.jobs import basecopy, remote_made
    from minilmd.tmpnames import host_tag
    from minilmd.daemon.jobs.remote_local import LocalRemote
    staged, theirs, url, renames, record = sys.argv[1:]
    if renames == "plain":  # NFS: renameat2's flags not done (EINVAL)
        dirfd.renameat2 = lambda *args: False

    class KilledWhileLooking(LocalRemote):
        def put(self, local, *names):  # another machine publishes its base's copy after this push read the record
            if names[-1] == basecopy.INIT_RECORD:
                arriving = shutil.copytree(theirs, self.path(".tmp-init-otherhost-7"))
                fsio.publish_dir(arriving, self.path(basecopy.REMOTE_BASE))
            return super().put(local, *names)

        def cat(self, path, max_bytes):  # what stood at init, looked at under a temporary name: killed there
            if "/.tmp-init-" in path:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().cat(path, max_bytes)

    remote = KilledWhileLooking(url)
    remote.made = remote_made.Made(Path(record))  # the run's record, as its Syncer gives it
    basecopy.push(remote, Path(staged), host_tag(), os.getpid())
""")


@pytest.mark.parametrize("renames", ["renameat2", "plain"])
def test_another_bases_copy_left_by_a_push_killed_while_it_looked_is_quarantined_not_deleted(tmp_path, renames):
    """On main the next sync's clean-up removed the killed pid's temporary names whatever they held: the other
    machine's copy, swapped out of `init` (renameat2) or renamed aside (NFS: `<tmp>-replaced`, removed once a day
    old), was deleted. This run's own copy left there, and a half copy without a record, still go."""
    ours, theirs = staged_pth(tmp_path, "ours"), staged_pth(tmp_path, "theirs")
    root = tmp_path / "remote"
    record = remote_made.scratch_record(tmp_path / "checkpoints")
    proc = subprocess.run([sys.executable, "-c", KILLED_WHILE_LOOKING, str(ours), str(theirs), str(root), renames,
                           str(record)])
    assert proc.returncode == -9
    left = {n.name: files_of(n) for n in root.iterdir() if n.name.startswith(".tmp-")}
    assert files_of(theirs) in left.values()  # killed in the window: theirs under a temporary name of the dead pid
    for name in left:
        os.utime(root / name, (time.time() - STALE_TMP_SECONDS - 60,) * 2)  # `-replaced` names no pid: a day old
    killed = open_remote(str(root))  # another push of this run, killed half-way: its copy is in the run's record
    killed.made = remote_made.Made(record)
    half = root / killed.make_tmp(sync_tmp_name(basecopy.REMOTE_BASE, tmpnames.host_tag(), _dead_pid()))
    (half / STAGED_PTH).write_bytes(b"half a copy, no record yet")

    logs: list[str] = []
    Syncer(tmp_path / "checkpoints", str(root), log=logs.append, base=ours).sync_newest()
    assert sorted(n.name for n in root.iterdir()) == [basecopy.REMOTE_BASE, QUARANTINE]
    kept = list((root / QUARANTINE).iterdir())
    assert len(kept) == 1 and {k: v for k, v in files_of(kept[0]).items() if k != REASON_FILE} == files_of(theirs)
    assert files_of(root / basecopy.REMOTE_BASE) == files_of(ours)
    assert [line for line in logs if "another LoRA base" in line and "quarantined" in line]


def _dead_pid() -> int:
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


class PublishedAfterTheRead(Remote):
    """A store without rename shared with another machine, which publishes its own base's copy (`theirs`, its
    files by name, the record last) at `init` right after this push's first read of the record there."""

    def __init__(self, url: str, theirs: dict[str, bytes]):
        super().__init__(url)
        self.theirs, self.published = theirs, False

    def cat(self, path: str, max_bytes: int) -> bytes:
        try:
            return super().cat(path, max_bytes)
        finally:
            if path == self.path(basecopy.REMOTE_BASE, STAGED_RECORD) and not self.published:
                self.published = True
                for rel, data in sorted(self.theirs.items(), key=lambda item: item[0] == STAGED_RECORD):
                    self.fs.pipe_file(self.path(basecopy.REMOTE_BASE, rel), data)


@pytest.mark.parametrize("stood", ["nothing", "a damaged copy of this base"])
def test_on_a_store_without_rename_a_copy_published_after_the_read_is_not_removed(tmp_path, stood):
    """On main the push removed what stood at `init` by then (make_tmp's recursive rm) and wrote this base in its
    place: the other machine's copy, published after the one read, was deleted."""
    ours, theirs = staged_pth(tmp_path, "ours"), staged_pth(tmp_path, "theirs")
    url = f"memory://basecopy-leftovers-{os.getpid()}-{tmp_path.name}"
    fs = fsspec.filesystem("memory")
    try:
        if stood != "nothing":
            assert basecopy.push(open_remote(url), ours, "h", 1) > 0
            fs.pipe_file(f"{url}/{basecopy.REMOTE_BASE}/{STAGED_PTH}", b"cut short")
        remote = PublishedAfterTheRead(url, files_of(theirs))
        assert basecopy.push(remote, ours, "h", 1) == 0
        init = remote.path(basecopy.REMOTE_BASE)
        assert {p[len(init) + 1:]: fs.cat_file(p) for p in fs.find(init)} == files_of(theirs)
    finally:
        fs.rm(url, recursive=True)
