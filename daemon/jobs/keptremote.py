"""`<run.dir>/unsynced/` as the local remote of the Syncer that keeps a Slurm job's unsynced checkpoint there
(daemon/jobs/keptcopy.py), told from run.remote's in two ways:
- its record of what its copies made is its own (remote_made.kept_record), never run.remote's: each sync's clean-up
  keeps only the entries naming what is on its own root, so one record for both dropped the other's (review12b F1);
- it never makes run.dir: a local remote makes its missing root with the directories above it, and a run.dir
  removed while the run ran (exit 73, final: daemon/phases/rundirwatch.py) was made again by the copy, and the job
  requeued into it (review12b F2). Here only `unsynced` is made, in run.dir opened by the place rule's checked
  walk (dirfd.Dir.open: nothing made on the way), and a run.dir that is not there fails the copy.
A kept copy that does not verify when it is fetched back is set aside into `unsynced/quarantine/` as any local
remote's, and recorded in this root's record by its identity (under QUARANTINE: a rename keeps the inode) when it is
proven this run's as a removal proves a step (its manifest names its step): that record alone lets
`drop_set_aside` remove it later (daemon/jobs/keptcopy.py says when); what the record does not prove stays.
Loads numpy (the Syncer): imported only when a checkpoint is copied, fetched back or removed.
"""
from __future__ import annotations

import errno
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minilmd.daemon.jobs import remote_made
from minilmd.daemon.jobs.remote_local import LocalRemote
from minilmd.daemon.jobs.remote_store import RemoteStore
from minilmd.daemon.jobs.sync import Syncer
from minilmd.dirfd import Dir
from minilmd.names import KEPT_DIR, QUARANTINE, leading_step
from minilmd.perms import owned_by_me
from minilmd.proc_info import this_maker
from minilmd.tmpnames import pointer_tmp_tag
from minilmd.untrusted import listed


@dataclass
class SetAside:
    """A kept copy set aside into quarantine/: where, why, and why it is left for good ("": recorded, removed later)."""

    where: str
    reason: str
    left: str = ""


def set_aside_step(name: str) -> int | None:
    """The step of a directory set aside into quarantine/ (`step-00000300-20261206T154615[-2]`), None for others."""
    return leading_step(name)


class KeptRemote(LocalRemote):
    """`<run.dir>/unsynced/`: its own record, and `unsynced` alone made when missing, never run.dir."""

    def __init__(self, run_dir: Path, tmp_tag: str):
        super().__init__(str(run_dir / KEPT_DIR), tmp_tag)
        self.run_dir = run_dir
        self.made = remote_made.kept_record(run_dir)
        self.set_aside_here: list[SetAside] = []
        """What this remote's fetches set aside, for keptcopy to say in one line."""

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

    def set_aside(self, name: str, reason: str) -> str | None:
        """`name` set aside into quarantine/ (LocalRemote's), recorded as this run's when its manifest names its
        step (remote_made.why_kept's proof of a step, looked at before the move; the move keeps the identity judged
        then, or refuses)."""
        root = self._root()
        st = root.lstat(name)
        left = "not there" if st is None else remote_made.why_kept(root, name, st, self.made) or ""
        dest = super().set_aside(name, reason)
        assert dest is not None  # a local remote renames: set aside, or NotOurs raised
        if not left and st is not None:
            left = self._record_set_aside(root, dest.rsplit("/", 1)[-1], (st.st_dev, st.st_ino))
        self.set_aside_here.append(SetAside(dest, reason.removeprefix("fetch: "), left))
        return dest

    def _record_set_aside(self, root: Dir, name: str, identity: tuple[int, int]) -> str:
        """quarantine/`name` recorded when it is still the directory judged: why not ("" when recorded)."""
        try:
            with Dir.at(root, QUARANTINE) as into:
                if into.identity_of(name) != identity:
                    return "a directory moved there while it was set aside"
            self.made.record(QUARANTINE, identity)
        except OSError as e:  # run.dir full or failing: never removed then, by no proof
            return f"its record in {self.made.where()} was not written ({e.strerror or e})"
        return ""

    def drop_set_aside(self, due: Callable[[int | None], bool]) -> tuple[list[str], list[str]]:
        """Each directory in quarantine/ this root's record proves this run set aside, removed when `due(its
        step)` (through descriptors, only while its name leads to the identity recorded); quarantine/ with them
        once empty (rmdir: a directory of this user's holding nothing). (what was removed, what was left and why),
        as words; anything the record does not prove is never looked into. A recorded one no longer there (removed
        by hand) is forgotten: keep_only keeps every record of quarantine/ while it is there."""
        root = self._root()
        found = root.lstat(QUARANTINE)
        if found is None or not stat.S_ISDIR(found.st_mode) or not owned_by_me(found):
            return [], []
        removed, left = [], []
        with Dir.at(root, QUARANTINE) as into:
            if into.identity != (found.st_dev, found.st_ino):
                return [], []  # swapped since the look: nothing removed
            present: set[tuple[int, int]] = set()
            for name in listed(into.fd):
                identity = into.identity_of(name)
                if identity is None:
                    continue
                present.add(identity)
                if not self.made.proves(QUARANTINE, identity) or not due(set_aside_step(name)):
                    continue
                if into.remove_tree(name, identity):
                    self.made.forget(QUARANTINE, identity)
                    removed.append(self.show(QUARANTINE, name))
                else:
                    left.append(f"{self.show(QUARANTINE, name)} (not removed whole: left)")
            self.made.keep_identities(QUARANTINE, present)  # one removed by hand: its record goes (keep_only can't)
        if removed:
            try:
                root.remove_dir(QUARANTINE)  # ENOTEMPTY while anything is left in it: then it stays
            except OSError:
                pass
        return removed, left


class KeptSyncer(Syncer):
    """A Syncer whose remote is `<run.dir>/unsynced/` (KeptRemote); one copy at most (retention keeps one)."""

    def __init__(self, checkpoint_dir: Path, run_dir: Path, expected):
        super().__init__(checkpoint_dir, str(run_dir / KEPT_DIR), expected, keep=1, run_dir=run_dir)
        self.kept_in = run_dir

    @property
    def remote(self) -> RemoteStore:
        if self._remote is None:
            opened = KeptRemote(self.kept_in, pointer_tmp_tag(*this_maker()))
            opened.moved = self._moved
            self._remote = opened
        return self._remote
