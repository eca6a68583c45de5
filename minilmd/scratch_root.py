"""The per-user root of a run's default scratch, and the private root a run uses instead when another user took the
default's name first.

The default scratch is `<base>/minilmd-<uid>/<run.name>` (base: /dev/shm, a Slurm job's $TMPDIR): a fixed name in a
directory every user may write (sticky). Anyone may `mkdir /dev/shm/minilmd-<uid of another user>` before her run
makes it (after a reboot, a requeue on another node). Nothing of his is ever used (minilmd/scratch.py refuses it),
but a refusal is exit 2, final for systemd and the tmux launcher: one mkdir would end her unattended run for good.
So, at launch (`settle`), when the root the run would use is taken (another user's directory, a link, not a
directory), the run makes a root of its own with a name that was free (not a secret: base is listed by everyone),
`<base>/minilmd-<uid>-<8 random>` (tempfile.mkdtemp: created new, O_EXCL, 0700, never one that was there), and
records it in run.dir (names.SCRATCH_ROOT_RECORD). Every later start of the run reads the record, so it finds the
same scratch, its checkpoints included; a reboot that emptied base has it made again under the same name, and should
that name be taken too (base is listed by everyone), a new one is made and recorded. A record is used only when it is
this user's file in run.dir and names a root of this form under today's base; anything else there is no record. Never
a wait: the run goes on at once, in a place nobody else can have made.

The root is decided once, by `settle` at the supervisor's launch, which judges the root it returns (a taken one is
never returned), and is carried from there: the supervisor's config holds it (RunConfig.fix_scratch_root) and every
attempt's command names the scratch in it (`run.scratch`, daemon/child/trainerwatch.py), so no later read of the
record decides where a trainer writes. Only a missing record means "none": a record that is there but cannot be
read (EIO, ESTALE on an NFS run.dir) raises RecordUnreadable, never taken as "none", which would lead to the default
root, the very directory another user made. Torch-free.
"""
from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from minilmd import names
from minilmd.dirfd import PRIVATE
from minilmd.fsio import atomic_write_json
from minilmd.names import SCRATCH_BASE, SCRATCH_BASE_ENV, SLURM_JOB_ENV, default_scratch_root
from minilmd.perms import own_uid, owned_by_me, owner_in, user_words
from minilmd.supervision import supervision
from minilmd.untrusted import Unreadable, read_json

RECORD_MAX_BYTES = 4096
"""The largest record read: a path and a sentence."""


def base(environ: Mapping[str, str] | None = None) -> str:
    """Where the per-user roots go: /dev/shm, in a Slurm job the node's $TMPDIR if set (tests point it elsewhere);
    read in `environ` (this process's environment when None)."""
    env = os.environ if environ is None else environ
    if env.get(SCRATCH_BASE_ENV):
        return env[SCRATCH_BASE_ENV]
    if env.get(SLURM_JOB_ENV) and env.get("TMPDIR"):
        return env["TMPDIR"].rstrip("/") or SCRATCH_BASE
    return SCRATCH_BASE


class RecordUnreadable(Exception):
    """run.dir's record of the private root is there but could not be read (EIO, ESTALE): where this run's scratch
    is cannot be known now. Never taken as "no record" (the default root may be another user's): the launch ends,
    to be retried (exit 1, systemd's Restart)."""


def default_path(run_name: str, uid: int | None = None, run_dir: Path | None = None,
                 in_root: Path | None = None) -> Path:
    """The default run.scratch of this user (or of `uid`); in a Slurm job one per job, `<run.name>-slurm<job id>`:
    a node's scratch is the job's alone (daemon/slurm/job.py removes it once the remote holds the last checkpoint).
    In `in_root` when given (the root `settle` decided); else with `run_dir`, in the private root that run.dir
    records, if it records one (module docstring: RecordUnreadable when the record cannot be read)."""
    uid = own_uid() if uid is None else uid
    return (in_root if in_root is not None else root(run_dir, uid)) / default_name(run_name)


def default_name(run_name: str) -> str:
    job = os.environ.get(SLURM_JOB_ENV, "")
    return f"{run_name}-slurm{job}" if job.isdigit() else run_name


def in_default_root(scratch: Path) -> bool:
    """Whether a run.scratch set by hand lies directly in this user's per-user default root,
    `<base>/minilmd-<uid>/NAME` (the demo writes its scratch so, and a config copied from it, or one that spelled the
    default out): that root is no choice of the user's, only where minilmd keeps her scratches, so it is settled as
    an unset run.scratch's is (a private root where another user took it, NAME kept in it; before, exit 2, final,
    hostile audit 7 F4). A run.scratch anywhere else is her choice: used as written, refused when not hers. Not in a
    trainer the supervisor started (minilmd/supervision.py): it is given the settled scratch, never looks it up
    again."""
    return root_form(scratch.parent, own_uid(), private=False) and supervision() is None


def is_default_form(scratch: Path, run_name: str) -> bool:
    """Whether `scratch` is where a default scratch of this user's goes: the default name in the per-user root or
    in a root of the private form (`<base>/minilmd-<uid>-XXXXXXXX`). Reads nothing: a default scratch (also when
    written out, or passed to a trainer) is held to a default's rules (its root private to this user)."""
    return scratch.name == default_name(run_name) and root_form(scratch.parent, own_uid())


def root_form(path: Path, uid: int, private: bool = True) -> bool:
    """Whether `path` is, by its name, a root of `uid`'s default scratches: the per-user `<base>/minilmd-<uid>`, or
    (`private`) a private one `<base>/minilmd-<uid>-XXXXXXXX`. Reads nothing: the one test of in_default_root,
    is_default_form and not_looked_in."""
    return path == Path(default_scratch_root(uid, base())) or (private and _private_form(path, uid))


def not_looked_in(scratch: Path, owner: int | None = None) -> str | None:
    """Why a reader of a run (`status`, `stop`, `sample/export/verify RUN_DIR`) does not look in its scratch: the
    per-user root it lies in (one of the default's or the private form, by its name), the scratch itself or its
    checkpoints directory stands there as someone else's (`taken`). After a reboot emptied base, anyone may make
    those names first (base is listed by everyone, a private root's name too), and nothing in his directory is the
    run's: his "newer checkpoint" is never shown, never called unsynced. None: looked in (also when it is gone).
    The one rule of every reader (checkpoint_select.run_roots, daemon/views/newest.py, status's lineage). `owner`:
    the run's user, when the reader is another (root's `status` of her run: her directories are hers); this user's
    when None."""
    uid = own_uid() if owner is None else owner
    places = ([scratch.parent] if root_form(scratch.parent, uid) else []) + [scratch, scratch / names.CHECKPOINTS]
    return next((why for place in places if (why := taken(place, uid))), None)


def _private_form(path: Path, uid: int) -> bool:
    return path.parent == Path(base()) and re.fullmatch(rf"minilmd-{uid}-[a-z0-9_]{{8}}", path.name) is not None


def root(run_dir: Path | None, uid: int | None = None) -> Path:
    """The per-user root a default scratch goes in: the private one `run_dir` records, else `<base>/minilmd-<uid>`."""
    uid = own_uid() if uid is None else uid
    return (recorded(run_dir, uid) if run_dir is not None else None) or Path(default_scratch_root(uid, base()))


def recorded(run_dir: Path, uid: int | None = None) -> Path | None:
    """The private root run.dir's record names (`record`), None when it records none of ours."""
    rec = record(run_dir, uid)
    return rec.root if rec is not None else None


@dataclass(frozen=True)
class Record:
    """run.dir's record of a private root, as `record` believes it."""

    root: Path
    because: str | None
    """Why the default root was not used, in the words `settle` wrote (None: a record without them)."""


def record(run_dir: Path, uid: int | None = None) -> Record | None:
    """The one reader of run.dir's record: only from a file of this user's (or `uid`'s: no link followed,
    bounded), and only a root of the form `<base>/minilmd-<uid>-<8 of mkdtemp's letters>` under today's base; None
    when there is no record, or what is there is none of ours (a link, another's file, not such a root: `settle`
    judges the default root then, and records a new one if it is taken). RecordUnreadable when it could not be
    read."""
    uid = own_uid() if uid is None else uid
    try:
        rec = read_json(Path(run_dir) / names.SCRATCH_ROOT_RECORD, max_bytes=RECORD_MAX_BYTES, owner=uid)
    except Unreadable as e:
        if e.kind in ("io", "changed"):  # there, but not read now: a failing mount, a write under way
            raise RecordUnreadable(f"{e}: where this run's scratch root is cannot be known now") from None
        return None  # missing (ENOENT), or not a record of ours
    except OSError as e:  # pragma: no cover - read_json raises Unreadable only
        raise RecordUnreadable(f"{names.SCRATCH_ROOT_RECORD}: {e}") from None
    path, because = rec.get("root"), rec.get("because")
    if not isinstance(path, str) or not _private_form(Path(path), uid):
        return None
    return Record(Path(path), because if isinstance(because, str) else None)


def taken(path: Path, owner: int | None = None) -> str | None:
    """Why `path` cannot be a root of this user's (of `owner`'s when given) because someone else put something there
    first (another user's directory, a link, a file), in words naming its owner; None when it is missing or a
    directory of ours. Reads only."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        return f"{path} cannot be looked at ({e.strerror or e})"
    who = user_words(st.st_uid)
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link of {who}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is a file of {who}, not a directory"
    if not (owned_by_me(st) if owner is None else owner_in(st, (owner,))):
        return f"{path} belongs to {who}"
    return None


def settle(run_dir: Path) -> tuple[Path, str | None]:
    """At launch, for a default scratch, before it is claimed: make the root this run would use (the recorded one,
    else the default) 0700 if it is missing; if someone else's stands there, make a private one (mkdtemp) and
    record it in run.dir. Returns the root the run uses from now on (never a taken one; the caller carries it:
    RunConfig.fix_scratch_root) and what was done in words (for stdout and the run's events), None when the usual
    root serves. An OSError of the usual root's mkdir (base missing) is left to the claim to say; one making the
    private root (base full) is raised; one writing its record is RecordUnwritten (the root removed again), and
    RecordUnreadable is raised as it comes."""
    uid = own_uid()
    usual = root(run_dir, uid)
    try:
        os.mkdir(usual, PRIVATE)  # a root of ours from now on: in a sticky base no one else can replace it
    except FileExistsError:
        pass
    except OSError:
        return usual, None
    why = taken(usual)
    if why is None:
        return usual, None
    made = Path(tempfile.mkdtemp(prefix=f"minilmd-{uid}-", dir=base()))  # 0700, a name that was free
    try:
        atomic_write_json(Path(run_dir) / names.SCRATCH_ROOT_RECORD,
                          {"root": str(made), "because": why, "since": time.time()})
    except OSError as e:  # unrecorded, no restart would find it: a retry's root beside it would leak one a try
        os.rmdir(made)  # this try's own, empty: made a moment ago
        raise RecordUnwritten(e) from e
    return made, said(why, made)


class RecordUnwritten(Exception):
    """run.dir's record of a new private root could not be written (`error`: run.dir full, say); the root this try
    made is removed again, so that a retry leaves no directory behind in base."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


def said(why: str, made: Path) -> str:
    return (f"the default scratch root is not used: {why}, made before this run could make it (nothing of this "
            f"run goes there); this run's scratch root is {made}, made new (0700, a random name that was free; "
            f"not a secret: readers look in it only while it is this user's) and "
            f"recorded in run.dir ({names.SCRATCH_ROOT_RECORD}) so that every restart finds it; an admin may remove "
            f"the other user's directory: this run keeps its own root")


def in_use(run_dir: Path, made: Path) -> str:
    """For the run's start event: `made`, the root in use (settled at launch), when it is a private one, and why,
    from the record if it can be read; "" for any other root."""
    if not _private_form(made, own_uid()):
        return ""
    try:
        rec = record(run_dir)
    except RecordUnreadable:
        rec = None
    why = rec.because if rec is not None and rec.root == made else None
    return f"scratch in the private root {made}" + (f" (the default: {why})" if why else "")


def moved_words(run_dir: Path, scratch: Path, recorded_in: Path) -> str:
    """Why a checkpoint recorded at `recorded_in` (a path in another scratch) is not in the run's scratch now
    (`scratch`): the default root was taken by another user and the run's default scratch moved to a private root
    (a reason no user chose: before, "run.scratch changed" was said of it, user3 F6), else run.scratch changed."""
    if (private := in_use(run_dir, scratch.parent)) and scratch.parent not in recorded_in.parents:
        return f"the default scratch root was taken, so the run's scratch is now {scratch}: {private}"
    return f"run.scratch changed: the run's scratch is now {scratch}"


def status_words(run_dir: Path, owner: int) -> tuple[str, dict | None]:
    """For `minilmd status` of a run directory of `owner`'s: (a line, the same for --json) naming the private root
    its record names and why, ("", None) when the run uses the default root. `run_dir`: a path the record is read
    through (status's: the run directory's descriptor)."""
    try:
        rec = record(run_dir, owner)
    except RecordUnreadable as e:
        return (f"  scratch root: {names.SCRATCH_ROOT_RECORD} cannot be read now ({e})",
                {"unreadable": str(e)})
    if rec is None:
        return "", None
    why = f" (the default: {rec.because})" if rec.because else ""
    return (f"  scratch root: the private root {rec.root}{why}; every restart of the run uses it "
            f"({names.SCRATCH_ROOT_RECORD})", {"root": str(rec.root), "because": rec.because})


def check_note(scratch_dir: Path, by_default: bool) -> str:
    """For `run --check`: a default scratch (`by_default`: run.scratch unset, the one `settle` serves) whose root
    someone else took, and what the launch does about it; "" otherwise."""
    if not by_default or not (why := taken(scratch_dir.parent)):
        return ""
    return (f"the default scratch root is taken: {why}; the launch never uses it: it makes a private root "
            f"{base()}/minilmd-{own_uid()}-XXXXXXXX (0700, a random name) and records it in run.dir "
            f"({names.SCRATCH_ROOT_RECORD}), where every restart finds it")
