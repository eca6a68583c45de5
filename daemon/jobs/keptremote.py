"""`<run.dir>/unsynced/` as the local remote of the Syncer that keeps a Slurm job's unsynced checkpoint there
(daemon/jobs/keptcopy.py), told from run.remote's in two ways:
- its record of what its copies made is its own (remote_made.kept_record), never run.remote's: each sync's clean-up
  keeps only the entries naming what is on its own root, so one record for both dropped the other's (review12b F1);
- it never makes run.dir: a local remote makes its missing root with the directories above it, and a run.dir
  removed while the run ran (exit 73, final: daemon/phases/rundirwatch.py) was made again by the copy, and the job
  requeued into it (review12b F2). Here only `unsynced` is made, in run.dir opened by the place rule's checked
  walk (dirfd.Dir.open: nothing made on the way), and a run.dir that is not there fails the copy.
Loads numpy (the Syncer): imported only when a checkpoint is copied, fetched back or removed.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

from minilmd.daemon.jobs import remote_made
from minilmd.daemon.jobs.remote_local import LocalRemote
from minilmd.daemon.jobs.remote_store import RemoteStore
from minilmd.daemon.jobs.sync import Syncer
from minilmd.dirfd import Dir
from minilmd.names import KEPT_DIR, host_tag, pointer_tmp_tag


class KeptRemote(LocalRemote):
    """`<run.dir>/unsynced/`: its own record, and `unsynced` alone made when missing, never run.dir."""

    def __init__(self, run_dir: Path, tmp_tag: str):
        super().__init__(str(run_dir / KEPT_DIR), tmp_tag)
        self.run_dir = run_dir
        self.made = remote_made.kept_record(run_dir)

    def _make_root(self) -> None:
        """`unsynced` made (mkdirat) in run.dir opened by its checked walk, when nothing stands at its name (what
        does, a link or a file, is refused by the root's own check, `_root`); FileNotFoundError when run.dir is not
        there."""
        try:
            opened = Dir.open(self.run_dir, "run.dir")
        except FileNotFoundError as e:
            raise FileNotFoundError(errno.ENOENT, f"run.dir {self.run_dir} is not there (removed while the run "
                                                  f"ran?): nothing is made there") from e
        with opened as run_dir:
            if run_dir.lstat(KEPT_DIR) is None:
                try:
                    run_dir.make_dir(KEPT_DIR)  # as the remote's own walk made it: 0o777 less the umask
                except FileExistsError:
                    pass  # made meanwhile: judged as it is by `_root`


class KeptSyncer(Syncer):
    """A Syncer whose remote is `<run.dir>/unsynced/` (KeptRemote); one copy at most (retention keeps one)."""

    def __init__(self, checkpoint_dir: Path, run_dir: Path, expected):
        super().__init__(checkpoint_dir, str(run_dir / KEPT_DIR), expected, keep=1, run_dir=run_dir)
        self.kept_in = run_dir

    @property
    def remote(self) -> RemoteStore:
        if self._remote is None:
            opened = KeptRemote(self.kept_in, pointer_tmp_tag(host_tag(), os.getpid()))
            opened.moved = self._moved
            self._remote = opened
        return self._remote
