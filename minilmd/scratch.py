"""A run's scratch belongs to that run alone: a private directory per user, and a marker naming the owning run.

Two runs sharing one scratch would stage over each other's corpus and prune each other's checkpoints; a directory
another user made first, or a symbolic link put where scratch goes, would receive a run's files or refuse them at
launch. So:
- the default `run.scratch` is `/dev/shm/minilmd-<uid>/<run.name>` (in a Slurm job `<$TMPDIR or /dev/shm>/minilmd-
  <uid>/<run.name>-slurm<job id>`): the per-user root and the scratch in it are created 0700, and each must be a
  real directory (not a symbolic link) owned by this user; where another user took the root's name first, the
  launch makes a private root instead and records it in run.dir (minilmd/scratch_root.py), never a refusal;
- a run.scratch chosen by hand (this user's) is made 0700 at its claim too, and its marker and trainer.lock are
  0600 whatever run.share says (lockfile.LOCK_FILE_MODE: whoever can open a lock file can flock it, hostile10 F2);
- a scratch carries `owner.json` (names.SCRATCH_OWNER) naming the run directory it belongs to; any other run
  (another `run.dir` with the same `run.name`, a copied config, another user) is refused with the name of the
  owner: at `minilmd run --check`, at launch and by `minilmd train` (exit 2, final); one holding only that marker,
  of a run.dir gone (a launch that failed at once), is said so (scratch_remade.marker_only_words), never removed;
- a scratch without a marker (chosen by hand, or made by an older minilmd) is adopted by the first run that claims it,
  and only while it is empty: a directory holding anything else (someone's `corpus/`) is refused, never emptied; a
  trainer.lock of this user's that no process holds (trainer_lock.left_unheld: a by-hand trainer's) is no content;
- no directory above the scratch belongs to or can be written by another user (unless it is sticky and root's or
  this user's, like /tmp and /dev/shm), nor the scratch itself, and a link on the way to it is followed only when
  it is root's or this user's (the place rule's walk, minilmd/place_rule.py walk_problem: the one Dir.open takes to
  the scratch, so the check and the use give one answer, `..` after a link going up from where it leads, as the
  kernel's opens by path do); the scratch itself is no link at all: such a user could swap the scratch for a link
  to the owner's data, or for his own directory, at any time;
- the claim is made again before every staging and every trainer start (daemon/jobs/stagingworker.py); a scratch
  whose identity (device, inode, owner) changed since this process first claimed it is a final error naming the
  change (ScratchChanged); the very one claimed, its marker removed (an `rm -rf` that raced a save), is marked
  again (scratch_remade.partly_removed); `ensure_held()` is asked right before staging removes anything in it.

`problems()` only reads (the config check calls it); `claim()` creates and marks (the supervisor at launch and
again before each staging and trainer start, a Slurm node, the trainer when it runs on its own); `remove_own()`
deletes a scratch only if it is this user's and marked for the given run (the demo, and minilmd/scratch_end.py,
which gives a run's scratch back at its end). Torch-free.
"""
from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from minilmd import names, run_owner
from minilmd.dirfd import PRIVATE
from minilmd.lockfile import LOCK_FILE_MODE
from minilmd.names import SCRATCH_OWNER, TRAINER_LOCK
from minilmd.perms import others_can_write, own_uid, owned_by_me, user_words
from minilmd.place_rule import SCRATCH_ADVICE, lstat_or_none, walk_problem
from minilmd.scratch_remade import marker_only_words, newest_step, partly_removed, remade_words, unmarked_words
from minilmd.scratch_root import base, default_path  # noqa: F401 - where callers have always found them
from minilmd.tmpnames import atomic_tmp_prefix
from minilmd.untrusted import TooManyEntries, Unreadable, listed, read_json


class ScratchRefused(ValueError):
    """This run may not use this scratch; `problems` holds every reason (a config error: exit 2)."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class ScratchChanged(ScratchRefused):
    """The scratch is not the directory this process claimed (another one, or a link, put in its place): final.
    `remade`: a directory of this user's stands there (minilmd/scratch_remade.py), `newest_there` the newest
    checkpoint step in it (None: none), which a caller that knows the remote's newest compares with it."""

    def __init__(self, problems: list[str], remade: bool = False, newest_there: int | None = None):
        super().__init__(problems)
        self.remade, self.newest_there = remade, newest_there


@dataclass(frozen=True)
class Identity:
    """What a claimed scratch is: the directory itself, not its name."""

    dev: int
    ino: int
    uid: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_dev, st.st_ino, st.st_uid)

    def describe(self) -> str:
        return f"device {self.dev}, inode {self.ino}, owned by {user_words(self.uid)}"


_held: dict[str, Identity] = {}
"""Scratch paths this process has claimed, with what they were at the first claim: a later claim that finds another
directory there is ScratchChanged. A scratch that is gone (a cleaner emptied /dev/shm) is made and claimed afresh."""


def _dir_problem(label: str, path: Path, st: os.stat_result) -> str | None:
    """Why an existing path cannot be a directory of ours (None: it can)."""
    if stat.S_ISLNK(st.st_mode):
        return (f"{label} {path} is a symbolic link (to {_link_target(path)}): minilmd never follows one there, "
                f"since whoever placed it would choose where the run's files go; remove it, or set run.scratch")
    if not stat.S_ISDIR(st.st_mode):
        return f"{label} {path} exists and is not a directory"
    if not owned_by_me(st):
        return (f"{label} {path} belongs to {user_words(st.st_uid)}, not to you, {user_words(own_uid())}: a run never "
                f"uses another user's scratch; set run.scratch to a directory of yours")
    return None


def read_owner(scratch: Path) -> dict | None:
    """The marker of a scratch (None: no marker). Raises ValueError for one that cannot be read or is not ours."""
    marker = scratch / SCRATCH_OWNER
    st = lstat_or_none(marker)
    if st is None:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{marker} is not a regular file")
    try:
        owner = read_json(marker, max_bytes=names.OWNER_MAX_BYTES, expect=None)
    except Unreadable as e:
        raise ValueError(f"{marker} cannot be read ({e.why})") from None
    return run_owner.checked(owner, str(marker))


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _ancestry_problem(label: str, scratch: Path) -> str | None:
    """Why someone else could put another directory (or a link) where `scratch` is: another user's link on the way,
    or a directory above it that another user owns or can write (sticky ones of root or of this user excepted).
    Missing directories are fine: claim() makes them. None: the path stays where it is. The place rule's walk with
    nothing made (walk_problem), the scratch itself waived (`group_share`: _dir_problem and problems() judge it,
    stricter): by path (abspath), `a/link/../b` was judged as a/b, no link seen, where the walk (Dir.open's, in
    minilmd/trainer_lock.py) and the kernel's opens go to b beside where the link leads."""
    return walk_problem(scratch, label, "the scratch", SCRATCH_ADVICE, group_share=True)


def _foreign_entries(scratch: Path) -> list[str]:
    """What a scratch without a marker holds (names, sorted), besides a marker being written by a racing claim and a
    trainer.lock an ended trainer of this user left (trainer_lock.left_unheld: a by-hand trainer's in a scratch it
    never marked; one held or not ours still counts); for one of more entries than untrusted.listed reads, that
    alone: never read whole, whatever filled it."""
    try:
        names = listed(scratch)
    except FileNotFoundError:
        return []
    except TooManyEntries as e:
        return [str(e.strerror)]
    found = sorted(n for n in names if not n.startswith(atomic_tmp_prefix(SCRATCH_OWNER)))
    if TRAINER_LOCK in found:
        from minilmd import trainer_lock  # here: `status` and the supervisor's start import no minilmd.trainer*

        if trainer_lock.left_unheld(scratch):
            found.remove(TRAINER_LOCK)
    return found


def _adoption_problem(scratch: Path) -> str | None:
    """A scratch without a marker is adopted only when empty: what is in it is nobody's run's to replace."""
    found = _foreign_entries(scratch)
    return unmarked_words(scratch, found) if found else None


def _owner_problem(scratch: Path, run_dir: Path) -> str | None:
    try:
        owner = read_owner(scratch)
    except ValueError as e:
        return f"run.scratch {scratch}: {e}; if no run uses this scratch any more, remove {scratch / SCRATCH_OWNER}"
    if owner is None or run_owner.is_run(owner, run_dir):
        return None
    if words := marker_only_words(scratch, owner):
        return words
    return (f"run.scratch {scratch} belongs to another run: {run_owner.describe(owner)}. Two runs "
            f"never share a scratch (they would prune each other's checkpoints): give this run another run.name, or "
            f"set run.scratch; if that run is gone for good, remove {scratch}")


def problems(scratch: Path, run_dir: Path, is_default: bool) -> list[str]:
    """Why the run in `run_dir` may not use `scratch` (empty: it may). Reads only; creates nothing."""
    label = "run.scratch (the default)" if is_default else "run.scratch"
    if overlap := _overlap_problem(label, scratch, run_dir):
        return [overlap]
    paths = [("the per-user scratch root", scratch.parent), (label, scratch)] if is_default else [(label, scratch)]
    try:
        problem = _ancestry_problem(paths[0][0], paths[0][1])
        if problem:
            return [problem]
        for what, path in paths:
            st = lstat_or_none(path)
            if st is None:
                return []  # created at launch, 0700
            problem = _dir_problem(what, path, st)
            # the scratch itself: no other user may even add a name (a sticky bit does not help); claim() makes the
            # per-user root 0700
            if problem is None and path == scratch and others_can_write(st, path):
                problem = (f"{what} {path} can be written by other users (mode {stat.S_IMODE(st.st_mode):o}), who "
                           f"could swap what the run stages there; chmod go-w {path}, or set run.scratch")
            if problem:
                return [problem]
        problem = _owner_problem(scratch, run_dir.absolute().resolve())
        if problem is None and read_owner(scratch) is None:
            problem = _adoption_problem(scratch)
    except OSError as e:
        return [f"{label} {scratch} cannot be examined ({e.strerror or e})"]
    return [problem] if problem else []


def _overlap_problem(label: str, scratch: Path, run_dir: Path) -> str | None:
    """A scratch that is the run directory, holds it or lies inside it: giving scratch back (rmtree) would take the
    run's state, events and logs with it; staging and pruning would mix with them."""
    scratch, run_dir = scratch.absolute().resolve(), run_dir.absolute().resolve()
    if overlap(scratch, run_dir):
        return (f"{label} {scratch} and run.dir {run_dir} overlap: scratch is given back (deleted) when the run "
                f"ends, so it must be a directory of its own, neither holding run.dir nor inside it")
    return None


def overlap(a: Path, b: Path) -> bool:
    """Whether two resolved paths are one directory, or one lies inside the other."""
    return a == b or a in b.parents or b in a.parents


def remote_overlap_problem(remote: Path, scratch: Path, run_dir: Path) -> str | None:
    """A local run.remote that is scratch, holds it or lies inside it: giving scratch back (rmtree, once the remote
    holds the last checkpoint) would delete the remote's checkpoints with it, the only durable copy; and a remote
    that is run.dir itself would mix the sync's step directories, pointers and quarantine/ with the run's state and
    logs. A remote inside run.dir (a directory of its own there), or holding it, is fine: nothing deletes run.dir,
    and the sync touches only its own names in the remote's root."""
    remote, scratch, run_dir = (p.absolute().resolve() for p in (remote, scratch, run_dir))
    if overlap(remote, scratch):
        where = "is" if remote == scratch else "lies inside" if scratch in remote.parents else "holds"
        return (f"run.remote {remote} {where} run.scratch {scratch}: scratch is deleted when the run ends (and "
                f"when it is given back), and every checkpoint on the remote with it. run.remote is the durable "
                f"copy: set it to a directory on shared storage apart from scratch (or set run.scratch elsewhere)")
    if remote == run_dir:
        return (f"run.remote {remote} is run.dir itself: the sync's step directories, LATEST and quarantine/ would "
                f"mix with the run's state and logs; set run.remote to a directory of its own (e.g. "
                f"{run_dir / 'remote'})")
    return None


def _make_private_dir(path: Path, label: str, tighten: bool) -> Identity:
    """mkdir 0700 unless present; then check what is there without following a link (and make it 0700 if
    `tighten`)."""
    try:
        os.mkdir(path, PRIVATE)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # a symbolic link (ELOOP) or not a directory (ENOTDIR)
        raise ScratchRefused([_dir_problem(label, path, os.lstat(path)) or f"{label} {path}: cannot be opened"]) \
            from None
    try:
        st = os.fstat(fd)
        problem = _dir_problem(label, path, st)
        if problem:
            raise ScratchRefused([problem])
        if tighten and stat.S_IMODE(st.st_mode) != PRIVATE:
            os.fchmod(fd, PRIVATE)  # ours: nobody else may list or enter it
        return Identity.of(st)
    finally:
        os.close(fd)


def claim(scratch: Path, run_dir: Path, run_name: str, is_default: bool) -> Identity:
    """Make `scratch` this run's: create it (0700; and the per-user root 0700 for the default) and write the marker
    if there is none. Raises ScratchRefused when `problems()` has any, or another run won a race for it, and
    ScratchChanged when another directory stands where this process claimed one before. Called again before each
    staging and trainer start; returns what the scratch is."""
    run_dir = run_dir.absolute().resolve()
    _check_held(scratch)  # a swap is named as one, before problems() finds a link or a stranger's directory
    if partly_removed(scratch, held_identity(scratch)):  # this run's own, its marker removed: marked again
        _write_marker(scratch, run_dir, run_name)
    found = problems(scratch, run_dir, is_default)
    if found:
        raise ScratchRefused(found)
    if is_default:
        _make_private_dir(scratch.parent, "the per-user scratch root", tighten=True)
    else:
        scratch.parent.mkdir(parents=True, exist_ok=True)
    identity = _make_private_dir(scratch, "run.scratch", tighten=True)  # a hand-made one too (hostile10 F2)
    found = problems(scratch, run_dir, is_default)  # again, now that every directory on the way exists
    if found:
        raise ScratchRefused(found)
    _check_held(scratch, identity)
    if not os.path.lexists(scratch / SCRATCH_OWNER):
        _write_marker(scratch, run_dir, run_name)
    _held.setdefault(_key(scratch), identity)
    return identity


def _write_marker(scratch: Path, run_dir: Path, run_name: str) -> None:
    """The marker, LOCK_FILE_MODE whatever run.share says: supervisors flock it (minilmd/scratch_hold.py), and
    whoever can open it can (hostile10 F2)."""
    tmp = scratch / f"{atomic_tmp_prefix(SCRATCH_OWNER)}{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_FILE_MODE)
        with open(fd, "wb") as f:
            os.fchmod(fd, LOCK_FILE_MODE)  # not what the umask leaves of it
            f.write(run_owner.encode(run_owner.record(run_dir, run_name)))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, scratch / SCRATCH_OWNER)  # never replaces a marker another run wrote meanwhile
        except FileExistsError:
            problem = _owner_problem(scratch, run_dir)
            if problem:
                raise ScratchRefused([problem]) from None
    finally:
        tmp.unlink(missing_ok=True)


def _key(scratch: Path) -> str:
    return os.path.abspath(scratch)


def held_identity(scratch: Path) -> Identity | None:
    """What `scratch` was when this process first claimed it (None: it claimed none there)."""
    return _held.get(_key(scratch))


def _check_held(scratch: Path, now: Identity | None = None) -> None:
    """ScratchChanged if another directory (or a link, or nothing we can open) stands where this process claimed
    `scratch`. A scratch that is simply gone is no change (it is made again, 0700, and claimed afresh)."""
    before = _held.get(_key(scratch))
    if before is None:
        return
    if now is None:
        st = lstat_or_none(scratch)
        if st is None:
            _held.pop(_key(scratch), None)
            return
        if stat.S_ISLNK(st.st_mode):
            raise ScratchChanged([_changed(scratch, before, f"a symbolic link to {_link_target(scratch)}")])
        now = Identity.of(st)
    if now != before and now.uid == own_uid():
        newest = newest_step(scratch)
        raise ScratchChanged([remade_words(scratch, before, now, newest)], True, newest)
    if now != before:
        raise ScratchChanged([_changed(scratch, before, f"a directory of {now.describe()}")])


def _changed(scratch: Path, before: Identity, now: str) -> str:
    return (f"run.scratch {scratch} changed since this run claimed it: it was the directory of {before.describe()}, "
            f"it is now {now}; someone replaced it, so the run stops rather than stage into, delete from or train "
            f"in what stands there now (final); check who can change {scratch.parent}")


def ensure_held(scratch: Path) -> None:
    """Right before staging removes anything in `scratch`: raise ScratchChanged if this process claimed another
    directory there, and ScratchRefused unless the path is a directory of this user's that nobody else can swap.
    (Staging without a claim, as a tool or a test may call it, gets the second part only.)"""
    _check_held(scratch)
    st = lstat_or_none(scratch)
    problem = _ancestry_problem("run.scratch", scratch) or (st and _dir_problem("run.scratch", scratch, st))
    if problem:
        raise ScratchRefused([problem])


def remove_own(scratch: Path, run_dir: Path) -> str | None:
    """Delete `scratch` if it is this user's and marked for `run_dir` (None: removed or absent); else leave it and
    say why. For the demo, which starts afresh each time but may remove only what it made."""
    run_dir = run_dir.absolute().resolve()
    st = lstat_or_none(scratch)
    if st is None:
        return None
    problem = _overlap_problem("scratch", scratch, run_dir) or _dir_problem("scratch", scratch, st)
    if problem:
        return problem
    try:
        owner = read_owner(scratch)
    except ValueError as e:
        return str(e)
    if owner is None:
        return f"{scratch} carries no {SCRATCH_OWNER}: not known to be this run's, so it is left alone"
    if not run_owner.is_run(owner, run_dir):
        return f"{scratch} belongs to {run_owner.describe(owner)}, not to {run_dir}: left alone"
    shutil.rmtree(scratch)
    _held.pop(_key(scratch), None)  # gone on purpose: a later claim makes a new one
    return None
