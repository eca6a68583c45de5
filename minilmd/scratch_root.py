"""The per-user root of a run's default scratch, and the private root a run uses instead when another user took the
default's name first.

The default scratch is `<base>/minilmd-<uid>/<run.name>` (base: /dev/shm, a Slurm job's $TMPDIR): a fixed name in a
directory every user may write (sticky). Anyone may `mkdir /dev/shm/minilmd-<uid of another user>` before her run
makes it (after a reboot, a requeue on another node). Nothing of his is ever used (minilmd/scratch.py refuses it), but
a refusal is exit 2, final for systemd and the tmux launcher: one mkdir would end her unattended run for good. So,
at launch (`settle`), when the root the run would use is taken (another user's directory, a link, not a directory),
the run makes a root of its own with an unguessable name, `<base>/minilmd-<uid>-<8 random>` (tempfile.mkdtemp:
created new, O_EXCL, 0700, never one that was there), and records it in run.dir (names.SCRATCH_ROOT_RECORD). Every
later start of the run reads the record (`default_path(run_name, run_dir)`, which `RunConfig.scratch_dir` asks), so
it finds the same scratch, its checkpoints included; a reboot that emptied base has it made again under the same
name, and should that name be taken too (base is listed by everyone), a new one is made and recorded. A record is
used only when it is this user's file in run.dir and names a root of this form under today's base; anything else
there is no record. Never a wait: the run goes on at once, in a place nobody else can have made. Torch-free.
"""
from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from minilmd import names
from minilmd.fsio import atomic_write_json
from minilmd.names import SCRATCH_BASE, SCRATCH_BASE_ENV, SLURM_JOB_ENV, default_scratch_root
from minilmd.perms import own_uid, owned_by_me, user_words
from minilmd.untrusted import Unreadable, read_json

PRIVATE = 0o700
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


def default_path(run_name: str, uid: int | None = None, run_dir: Path | None = None) -> Path:
    """The default run.scratch of this user (or of `uid`); in a Slurm job one per job, `<run.name>-slurm<job id>`:
    a node's scratch is the job's alone (daemon/slurm/job.py removes it once the remote holds the last checkpoint).
    With `run_dir`, in the private root that run.dir records, if it records one (module docstring)."""
    job = os.environ.get(SLURM_JOB_ENV, "")
    name = f"{run_name}-slurm{job}" if job.isdigit() else run_name
    uid = own_uid() if uid is None else uid
    return root(run_dir, uid) / name


def root(run_dir: Path | None, uid: int | None = None) -> Path:
    """The per-user root a default scratch goes in: the private one `run_dir` records, else `<base>/minilmd-<uid>`."""
    uid = own_uid() if uid is None else uid
    return (recorded(run_dir, uid) if run_dir is not None else None) or Path(default_scratch_root(uid, base()))


def recorded(run_dir: Path, uid: int | None = None) -> Path | None:
    """The private root run.dir's record names: only from a file of this user's (no link followed, bounded), and
    only a root of the form `<base>/minilmd-<uid>-<8 of mkdtemp's letters>` under today's base; None otherwise."""
    uid = own_uid() if uid is None else uid
    try:
        rec = read_json(Path(run_dir) / names.SCRATCH_ROOT_RECORD, max_bytes=RECORD_MAX_BYTES, owner=uid)
    except (Unreadable, OSError):
        return None
    path = rec.get("root")
    if not isinstance(path, str):
        return None
    p = Path(path)
    if p.parent != Path(base()) or not re.fullmatch(rf"minilmd-{uid}-[a-z0-9_]{{8}}", p.name):
        return None
    return p


def taken(path: Path) -> str | None:
    """Why `path` cannot be a root of this user's because someone else put something there first (another user's
    directory, a link, a file), in words naming its owner; None when it is missing or a directory of ours. Reads
    only."""
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
    if not owned_by_me(st):
        return f"{path} belongs to {who}"
    return None


def settle(run_dir: Path) -> str | None:
    """At launch, for a default scratch, before it is claimed: make the root this run would use (the recorded one,
    else the default) 0700 if it is missing; if someone else's stands there, make a private one (mkdtemp) and
    record it in run.dir. Returns what was done in words (for stdout and the run's events), None when the usual
    root serves. An OSError of the usual root's mkdir (base missing) is left to the claim to say; one making the
    private root or its record (base or run.dir full) is raised."""
    uid = own_uid()
    usual = root(run_dir, uid)
    try:
        os.mkdir(usual, PRIVATE)  # a root of ours from now on: in a sticky base no one else can replace it
    except FileExistsError:
        pass
    except OSError:
        return None
    why = taken(usual)
    if why is None:
        return None
    made = Path(tempfile.mkdtemp(prefix=f"minilmd-{uid}-", dir=base()))  # 0700, a name that was free
    atomic_write_json(Path(run_dir) / names.SCRATCH_ROOT_RECORD,
                      {"root": str(made), "because": why, "since": time.time()})
    return said(why, made)


def said(why: str, made: Path) -> str:
    return (f"the default scratch root is not used: {why}, made before this run could make it (nothing of this "
            f"run goes there); this run's scratch root is {made}, made new (0700, a name nobody could know) and "
            f"recorded in run.dir ({names.SCRATCH_ROOT_RECORD}) so that every restart finds it; an admin may remove "
            f"the other user's directory: this run keeps its own root")


def in_use(run_dir: Path) -> str:
    """For the run's start event: the private root in use and why, from the record; "" when there is none."""
    made = recorded(run_dir)
    if made is None:
        return ""
    try:
        why = read_json(Path(run_dir) / names.SCRATCH_ROOT_RECORD, max_bytes=RECORD_MAX_BYTES,
                        owner=own_uid()).get("because")
    except (Unreadable, OSError):
        why = None
    return f"scratch in the private root {made}" + (f" (the default: {why})" if isinstance(why, str) else "")


def check_note(scratch_dir: Path, by_default: bool) -> str:
    """For `run --check`: a default scratch (`by_default`: run.scratch unset, the one `settle` serves) whose root
    someone else took, and what the launch does about it; "" otherwise."""
    if not by_default or not (why := taken(scratch_dir.parent)):
        return ""
    return (f"the default scratch root is taken: {why}; the launch never uses it: it makes a private root "
            f"{base()}/minilmd-{own_uid()}-XXXXXXXX (0700, a random name) and records it in run.dir "
            f"({names.SCRATCH_ROOT_RECORD}), where every restart finds it")
