"""What a sync may delete on its local remote: the one proof every removal there asks (`why_kept`, called by
remote_write.remove_ours, which LocalRemote.rm is the only way to).

A name proves nothing in a root others can rename within: a teammate who may write a team directory (group-writable,
not sticky) cannot delete this user's step directories, but he can rename one, within the root, to a temporary name
of this host and a dead pid (`.tmp-step-00000010-<host>-<pid>`), and the next sync would remove it as its own
leftover; or rename a newer step to an older step's name, for retention to prune it; or another of this user's
directories to a step name, where a step without a manifest counts as a half copy. Its owner (this user's) proves
nothing either. So what a sync removes is proven to be what this run made, by what the name cannot carry:
- a temporary directory (a checkpoint's or the LoRA base's copy, what stood at `init` moved aside): its (name, device,
  inode) is in this run's record of what its syncs made (`Made`, a file in the run's run.dir, `remote-made.json`,
  written and fsynced before anything is copied into it: it outlives a reboot, which empties a scratch in /dev/shm,
  so the half copy of a sync the reboot cut is still this run's to remove; the copies into run.dir/unsynced keep
  their own, `kept_record`: a record is of one root). A directory renamed to that name has
  another inode; one this run made, renamed to another of its names, has a record under another name. Before a
  complete copy is published under its final name, its record becomes one of a publish begun (`publishing`, with that
  name): never again proof that removes it (a published step another user renamed back to its temporary name is no
  half copy), and the next sync finishes a publish a kill cut before its rename (remote_publish.finish_cut_publish)
  instead of leaving a whole checkpoint under a temporary name for good. A FUSE share
  (the root's record: `mounts.renumbers_inodes`) numbers its inodes anew at each mount: there a checkpoint's copy of
  this host whose sync is over is proven by its recorded name once its inode is another, unless it holds a manifest
  of another step (a step renamed to that name says its own; fault audit 11, F4: a remount left the cut sync's half
  copy for good);
- a step directory: its manifest, read through the directory opened and checked to be the one judged, names that
  step (a step renamed to another step's name says its own; a directory without one is no sync's on a local
  remote, where copies are renamed into place whole); one a further copy replaced (a stopped DPO reference pass's
  step 0, moved out of its name by that copy's publish: daemon/jobs/sync_pass.py) names the step it stood at;
- a pointer's temporary file (LATEST's, BEST's): a regular file holding at most one step name, what one holds;
  the claim's (owner.json's, RemotePublish.put_new): one holding this run's claim, whole or its start cut past its
  run_dir field (a supervisor killed as it wrote it), which names this run's directory whole: another run's claim,
  or one cut before its run_dir ends, is never one.
The record also holds what the remote's root was when the run claimed it (`root`: its device, inode, file system;
daemon/jobs/remote_root.py judges by it), so that a root gone or replaced is never taken for it.
What fails its proof is left as it is, and the caller says so (an event and a log line). Torch-free.
"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from minilmd.dirfd import Dir
from minilmd.fsio import atomic_write_json, dir_removed, fsync_dir, is_disk_full
from minilmd.mounts import renumbers_inodes
from minilmd.names import (
    KEPT_MADE,
    MANIFEST,
    MANIFEST_MAX_BYTES,
    POINTER_MAX_BYTES,
    REMOTE_MADE,
    REMOTE_MADE_MAX_BYTES,
    REMOTE_MARK,
    TMP_PREFIX,
    is_step_name,
    leading_step,
    step_of,
)
from minilmd.perms import own_uid
from minilmd.proc_info import process_alive, this_hosts_remote_maker
from minilmd.untrusted import Unreadable, listed, loads, open_regular, read_bytes

SCRATCH_RECORD = ".remote-made.json"
"""The end of the record's name in scratch, beside the local checkpoint root (`scratch_record`)."""

Identity = tuple[int, int]
Entry = tuple[str, int, int]
Publish = tuple[str, int, int, str]
"""(temporary name, device, inode, the final name it is being published under): a row of four in the record."""


def run_record(run_dir: Path) -> Path:
    """Where a run keeps its record: in its run.dir (the user's own, held to the place rule, never on the remote),
    `<run.dir>/remote-made.json`, which a reboot leaves (scratch, in /dev/shm by default, it empties)."""
    return run_dir / REMOTE_MADE


def scratch_record(local_root: Path) -> Path:
    """Where the record of a Syncer whose local checkpoint root is `local_root` lies in scratch,
    `<scratch>/.checkpoints.remote-made.json`: an older minilmd's place for a run's (read once, `Made.was_at`), and
    the place for a Syncer without a run (a tool, a test). Not in the checkpoint root, where any entry is one a failed
    run's scratch is kept for (scratch_end.holds_checkpoints)."""
    return local_root.parent / f".{local_root.name}{SCRATCH_RECORD}"


def record_of(local_root: Path, run_dir: Path | None) -> Made:
    """The record a Syncer gives its local remote: the run's, in `run_dir`, that an older minilmd's record in scratch
    is read into once (an upgrade mid-run keeps what its syncs made); without a run dir, the one in scratch."""
    if run_dir is None:
        return Made(scratch_record(local_root))
    return Made(run_record(run_dir), was_at=scratch_record(local_root))


def kept_record(run_dir: Path) -> Made:
    """The record of the Syncer that keeps a Slurm job's unsynced checkpoint in `<run.dir>/unsynced/`
    (daemon/jobs/keptcopy.py), `<run.dir>/unsynced.remote-made.json`: one record per root, since each sync's clean-up
    drops the entries naming nothing on its own root (`keep_only`), and with one record for both, the kept copy's
    sync dropped run.remote's (the half copy a stalled last sync left there then never removable) and run.remote's
    the kept copy's (review12b F1). No fallback: a run.dir that is full or gone takes no copy either."""
    return Made(run_dir / KEPT_MADE)


class Made:
    """(name, device, inode) of each temporary directory this run's syncs made on its local remote and have not
    removed nor published yet: what `why_kept` lets a sync remove. Kept in `path` (run_record: the run's run.dir),
    so that the next sync after a kill, or a reboot, removes the half copy the cut one left; None: in this process
    only. `was_at`: where an older minilmd kept the run's record (scratch_record), joined into `path` and removed the
    first time the record is read. Read again before each change and each proof: another Syncer of the run in this
    process (the fetch's, the last sync's) may have written it since."""

    def __init__(self, path: Path | None = None, was_at: Path | None = None):
        self.path = path
        self.was_at = was_at
        self.fallback = was_at
        """Where the record goes while run.dir is full (ENOSPC, EDQUOT) or removed: scratch's place, read back into
        `path` at the next read once there is room (the last sync of a run whose run.dir filled up failed for it)."""
        self._entries: set[Entry] = set()
        self._publishing: set[Publish] = set()
        self._root: dict | None = None

    def _current(self) -> set[Entry]:
        if self.path is not None:
            self._entries, self._publishing, self._root = _load(self.path)
            if self.was_at is not None:
                self._adopt_old()
        return self._entries

    def _adopt_old(self) -> None:
        """The record an older minilmd kept in scratch, read once: what it holds is written at `path` first, then it
        is removed (a kill in between leaves both: read again, nothing lost). One that cannot be read is left."""
        old, self.was_at = self.was_at, None
        assert old is not None and self.path is not None
        try:
            found, publishing, root = _read(old)
        except Unreadable:
            return  # none (the usual case), or not this user's file: its word proves nothing
        if not found <= self._entries or not publishing <= self._publishing or (root and not self._root):
            self._entries |= found
            self._publishing |= publishing
            self._root = self._root or root
            if not self._save():
                return  # run.dir still full: written back where it was, kept there
        old.unlink(missing_ok=True)

    def _save(self) -> bool:
        """Written whole and durably, its name included (the directory fsynced): a power loss right after a `record`
        must not bring back a record without the directory whose copy then starts. Whether it went to `path`: with
        run.dir full, to `fallback`, which the next read joins into `path`."""
        if self.path is None:
            return True
        made: dict = {"made": sorted([list(e) for e in self._entries]) + sorted([list(e) for e in self._publishing])}
        if self._root is not None:
            made["root"] = self._root
        try:
            atomic_write_json(self.path, made)
            fsync_dir(self.path.parent)
            return True
        except OSError as e:  # run.dir full, or removed while the run ran: the last sync still goes on
            if not (is_disk_full(e) or dir_removed(e, self.path.parent)) or self.fallback is None:
                raise
        atomic_write_json(self.fallback, made)
        fsync_dir(self.fallback.parent)
        self.was_at = self.fallback
        return False

    def record(self, name: str, identity: Identity) -> None:
        """`name` with that identity made by this run: written (fsynced) before anything is copied into it."""
        self._current().add((name, *identity))
        self._save()

    def forget(self, name: str, identity: Identity | None = None) -> list[Identity]:
        """No record of `name` (with `identity` only, when given) any more: removed, or about to be published under
        its final name. The identities it had, for `restore` when nothing moved after all."""
        gone = [(dev, ino) for n, dev, ino in self._current() if n == name and identity in (None, (dev, ino))]
        if gone:
            self._entries -= {(name, *i) for i in gone}
            self._save()
        return gone

    def restore(self, name: str, identities: list[Identity]) -> None:
        """`name` recorded again with `identities` (a publish begun of it, if any, over: nothing moved after all)."""
        entries = self._current() | {(name, *i) for i in identities}
        publishing = {p for p in self._publishing if p[0] != name}
        if entries != self._entries or publishing != self._publishing:
            self._entries, self._publishing = entries, publishing
            self._save()

    def publishing(self, name: str, final: str) -> list[Identity]:
        """The record of `name` (a complete copy, on disk) made one of its publish under `final`, begun: written
        before the rename. The identities it had, for `restore` when nothing moved."""
        gone = [(dev, ino) for n, dev, ino in self._current() if n == name]
        if gone:  # one write: a kill between a forget and a record of the publish would leave the copy unrecorded
            self._entries -= {(name, *i) for i in gone}
            self._publishing |= {(name, *i, final) for i in gone}
            self._save()
        return gone

    def published(self, name: str) -> None:
        """The publish of `name` done (renamed, the root fsynced): no record of it any more."""
        self._current()
        publishing = {p for p in self._publishing if p[0] != name}
        if publishing != self._publishing:
            self._publishing = publishing
            self._save()

    def publishing_to(self, name: str, identity: Identity) -> str | None:
        """The final name of a publish of `name` (this identity) begun and not done: what a kill cut before the
        rename left. On a share that numbers its inodes anew at each mount, one recorded by that name."""
        anyone = _renumbered(self.root())  # read once: the publishes as the root
        return next((final for n, dev, ino, final in sorted(self._publishing)
                     if n == name and (anyone or (dev, ino) == identity)), None)

    def proves(self, name: str, identity: Identity) -> bool:
        return (name, *identity) in self._current()

    def recorded(self, name: str) -> bool:
        """Whether `name` is recorded, with any identity (a FUSE share mounted again numbers its inodes anew)."""
        return any(n == name for n, _, _ in self._current())

    def keep_only(self, names: set[str]) -> None:
        """Records of names no longer on the remote dropped (removed by hand, moved away): never proof of anything
        a later name is given. A record is of one root (`kept_record`): another root's entries would go too."""
        kept = {e for e in self._current() if e[0] in names}
        publishing = {p for p in self._publishing if p[0] in names}
        if kept != self._entries or publishing != self._publishing:
            self._entries, self._publishing = kept, publishing
            self._save()

    def keep_identities(self, name: str, identities: set[Identity]) -> None:
        """Records of `name` with an identity not in `identities` dropped: what keep_only is for the entries of a
        directory recorded by one name with many identities (the kept copy's quarantine/, one per copy set aside),
        each gone by hand no proof of what a later entry there is given."""
        kept = {e for e in self._current() if e[0] != name or (e[1], e[2]) in identities}
        if kept != self._entries:
            self._entries = kept
            self._save()

    def root(self) -> dict | None:
        """What the remote's root was when the run claimed it, as daemon/jobs/remote_root.py wrote it (None: none)."""
        self._current()
        return self._root

    def set_root(self, root: dict | None) -> None:
        """The remote's root as it is to be known from now on (remote_root.py), written durably (None: forgotten)."""
        self._current()
        if root != self._root:
            self._root = root
            self._save()

    def where(self) -> str:
        return str(self.path) if self.path is not None else "this process"


def _load(path: Path) -> tuple[set[Entry], set[Publish], dict | None]:
    """The record as written; none when there is none, or it is not this user's regular file of the right shape
    (nothing is removed on its word then: what it would have proven is left, and said where it is met)."""
    try:
        return _read(path)
    except Unreadable:
        return set(), set(), None


def _read(path: Path) -> tuple[set[Entry], set[Publish], dict | None]:
    """The entries of the record at `path`, its publishes begun (rows of four: an older minilmd skips them, as it
    does every row of another shape) and its root (a JSON object, or None; remote_root.py reads its fields);
    Unreadable when there is none, or it is not this user's regular file holding a JSON object."""
    found = loads(read_bytes(path, max_bytes=REMOTE_MADE_MAX_BYTES, owner=own_uid()), expect=dict)
    rows, root = found.get("made"), found.get("root")
    root = root if isinstance(root, dict) else None
    if not isinstance(rows, list):
        return set(), set(), root
    rows = [r for r in rows if isinstance(r, list) and len(r) in (3, 4) and isinstance(r[0], str)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in r[1:3])]
    return ({(r[0], r[1], r[2]) for r in rows if len(r) == 3},
            {(r[0], r[1], r[2], r[3]) for r in rows if len(r) == 4 and isinstance(r[3], str)}, root)


def made_new(root: Dir, name: str) -> Identity:
    """The identity of the directory `name` a sync has just made in root: it must hold no file nor directory but
    this user's mark (another of this user's directories renamed there since the mkdir, a checkpoint, would be
    recorded as this sync's temporary otherwise; a link someone planted in it is refused by the copy's own writes,
    never followed). OSError (EEXIST) when it does, TooManyEntries when it holds more than untrusted.listed reads."""
    with Dir.at(root, name) as made:
        held = [n for n in listed(made.fd) if n != REMOTE_MARK
                and not stat.S_ISLNK(os.stat(n, dir_fd=made.fd, follow_symlinks=False).st_mode)]
        if held:
            raise FileExistsError(f"{root.path / name} is not the empty directory just made (it holds "
                                  f"{len(held)} entries: renamed there meanwhile?)")
        return made.identity


def why_kept(root: Dir, name: str, st: os.stat_result, made: Made, file: bool = False,
             was: str | None = None, claim: bytes | None = None) -> str | None:
    """Why `name` in root, as lstat `st` found it, may not be removed by a sync: None when it is proven this run's
    (see the module's docstring). `was`: the name it had when this run recorded it (what stood at `init`, moved to
    a temporary name to be replaced: a step's, proven by its manifest as at its step name). `claim`: this run's
    claim (owner.json's bytes), which the claim's temporary file holds whole or cut."""
    identity = (st.st_dev, st.st_ino)
    if file:
        return _pointer_problem(root, name, identity, claim)
    if is_step_name(was or name):
        return _step_problem(root, name, identity, step_of(was or name))
    if made.proves(was or name, identity):
        return None
    if was is None and made.recorded(name) and _renumbered(made.root()):  # a FUSE share mounted again since it was made
        if (why := _half_copy_problem(root, name, identity)) is None:
            return None
        return (f"a directory by a name this run recorded in {made.where()}, not with its inode now (a share that "
                f"numbers its inodes anew at each mount), and {why}")
    return (f"a directory this run has no record of making there (not in {made.where()}: renamed there by another "
            f"user, or left by a sync before the record)")


def _renumbered(root: dict | None) -> bool:
    """Whether the root a record names (Made.root) is a share that numbers its inodes anew at each mount (FUSE's:
    mounted again, this run's own half copy has another inode than the one recorded as it was made): its record's
    name proves it."""
    return isinstance(fstype := (root or {}).get("fstype"), str) and renumbers_inodes(fstype)


def _half_copy_problem(root: Dir, name: str, identity: Identity) -> str | None:
    """None when `name`, recorded by this run on a share that renumbers its inodes, is proven its half copy by what its
    name and contents say: a checkpoint's temporary copy of this host (`.tmp-step-XXXXXXXX-<host>-<pid>-<ticks>-boot
    <tag>`, an older minilmd's without `-boot<tag>` or `-<ticks>`) whose sync is over (no process of that pid and
    start time in that boot, or this process's: no other sync of it runs while one cleans), holding no manifest or
    one of its step (a step directory of this run's renamed to that name by another user says its own step: left;
    the owner check is remote_write.not_made_here's, before this). A LoRA base's copy is never proven so."""
    maker = this_hosts_remote_maker(name)  # (pid, start ticks, boot): a recycled pid is no live sync
    step = leading_step(name.removeprefix(TMP_PREFIX)) if name.startswith(TMP_PREFIX) else None
    if maker is None or step is None or (maker[0] != os.getpid() and process_alive(*maker)):
        return "not a checkpoint's copy by a sync of this host that is over"
    said, why = _manifest_step(root, name, identity)
    if why is not None:
        return why
    if said is _NO_MANIFEST or said == step:
        return None
    return f"its {MANIFEST} says step {said!r}, not {step} (a step renamed there?)"


def _step_problem(root: Dir, name: str, identity: Identity, step: int) -> str | None:
    """None when the directory `name` (the one judged: `identity`) holds a manifest that names its step (`step`:
    that of its name, or of the step name it had)."""
    said, why = _manifest_step(root, name, identity)
    if why is not None:
        return why
    if said is _NO_MANIFEST:
        return f"a step directory without a {MANIFEST} (no sync of this run leaves one here: renamed there?)"
    if said != step:
        return f"a step directory whose {MANIFEST} says step {said!r}, not {step} (renamed there?)"
    return None


_NO_MANIFEST = object()  # what _manifest_step says of a directory that holds no manifest


def _manifest_step(root: Dir, name: str, identity: Identity) -> tuple[object, str | None]:
    """(the step the manifest of the directory `name` says, None), _NO_MANIFEST for the step where it holds none; or
    (None, why) where it cannot be judged: moved there while looked at (`identity` is the one judged), unreadable."""
    try:
        with Dir.at(root, name) as opened:
            if opened.identity != identity:
                return None, "a directory moved there while it was looked at: not removed"
            manifest = loads(read_bytes(MANIFEST, max_bytes=MANIFEST_MAX_BYTES, dir_fd=opened.fd), expect=dict)
    except Unreadable as e:
        return (_NO_MANIFEST, None) if e.missing else (None, f"its {MANIFEST} cannot be read ({e.why})")
    except OSError as e:
        return None, f"a directory that cannot be looked at ({e.strerror or e})"
    return manifest.get("step"), None


def _pointer_problem(root: Dir, name: str, identity: Identity, claim: bytes | None = None) -> str | None:
    """None when `name` (the file judged) holds what a pointer's temporary file holds: nothing yet, or one step
    name; or, given `claim`, what the claim's temporary holds: this run's claim, whole or its start past its run_dir (a
    supervisor killed while it wrote or before it renamed it: RemotePublish.put_new). Another of this user's files
    renamed there (the run's owner.json, another run's claim) is left."""
    try:
        fd = open_regular(name, dir_fd=root.fd)
    except Unreadable as e:
        return f"a file that cannot be read ({e.why})"
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != identity or not stat.S_ISREG(st.st_mode):
            return "a file moved there while it was looked at: not removed"
        data = os.read(fd, max(POINTER_MAX_BYTES, len(claim or b"")) + 1)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if claim and data and claim.startswith(data) and len(data) >= run_dir_field_end(claim):
        return None  # this run's own claim, or its start past its run_dir: what no other run's claim begins with
    text = data.decode("utf-8", errors="replace").strip()
    if text and not is_step_name(text):
        return "a file that holds no pointer (another file renamed to a pointer's temporary name?)"
    return None


def run_dir_field_end(claim: bytes) -> int:
    """How much of the claim's start names this run: up to the closing quote of its run_dir field (the host comes
    before it: sort_keys). A cut shorter than that may be another run's claim: `"run_dir": "/tmp/runs/a1` (run a1's,
    its writer killed) is the start of run a10's claim too (review10d F4)."""
    key = claim.find(b'"run_dir": "')
    if key < 0:
        return len(claim)
    i = key + len(b'"run_dir": "')
    while i < len(claim):
        if claim[i:i + 1] == b"\\":  # an escaped character of the path (a quote, a backslash)
            i += 2
        elif claim[i:i + 1] == b'"':
            return i + 1
        else:
            i += 1
    return len(claim)
