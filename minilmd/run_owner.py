"""Which run a place belongs to: the record a run's scratch and its run.remote both carry (`owner.json`, names.
SCRATCH_OWNER and names.REMOTE_OWNER), and the one rule that says whether it names this run.

A run is its run directory: `run_dir` is its absolute path, links resolved, as every host of the run (a Slurm job's
nodes, a restart on another machine) names the shared run.dir; the run's name, user and host are kept for the
words only. Two runs are two run directories: a config copied with another run.dir is another run, its run.name new
or the same, and the same run.dir under another run.name (renamed) is the same one. minilmd/scratch.py claims a
scratch with it, daemon/jobs/remote_claim.py a remote: the one rule for both (a run moved to another run.dir takes
its remote with `minilmd run --claim-remote`). Torch-free.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from minilmd.names import OWNER_MAX_BYTES as OWNER_MAX_BYTES  # its readers ask run_owner for it
from minilmd.perms import own_uid, owner_in, user_words
from minilmd.untrusted import printable


def run_identity(run_dir: Path) -> str:
    """What names a run in its owner record: its run directory's absolute path, links resolved."""
    return str(Path(run_dir).absolute().resolve())


def record(run_dir: Path, run_name: str) -> dict:
    """The owner record of the run in `run_dir` (written by the process that claims a place for it)."""
    return {"run_dir": run_identity(run_dir), "run_name": run_name, "uid": own_uid(),
            "host": socket.gethostname()}


def encode(owner: dict) -> bytes:
    return (json.dumps(owner, indent=2, sort_keys=True) + "\n").encode()


def checked(owner: object, where: str) -> dict:
    """`owner` (parsed from `where`) when it is an owner record; ValueError saying why not."""
    if not isinstance(owner, dict) or not isinstance(owner.get("run_dir"), str):
        raise ValueError(f"{where} does not name a run directory")
    return owner


def is_run(owner: dict, run_dir: Path) -> bool:
    """Whether the record names the run in `run_dir`."""
    return owner["run_dir"] == run_identity(run_dir)


def describe(owner: dict) -> str:
    """The run a record names, for a refusal: "the run directory D (run.name 'n', user (uid N) on host)". Every
    string of it shown through untrusted.printable: a record is a file someone else may have written (a shared
    remote's), and its escape codes must not reach the terminal."""
    uid = owner.get("uid")
    who = f"run.name {printable(repr(owner.get('run_name', '?')))}, " \
          f"{user_words(uid) if isinstance(uid, int) else 'uid ?'} on {printable(str(owner.get('host', '?')))}"
    return f"the run directory {printable(owner['run_dir'])} ({who})"


def remote_not_the_runs(root: Path, run_dir: Path, run_uid: int) -> str | None:
    """Why the local run.remote `root` that the run directory `run_dir` (of user `run_uid`) names is not read as
    that run's checkpoints (export, sample, chat, verify of RUN_DIR; init.from naming it); None when it is, or when
    it is not there. A reader's own run directory names what she chose. Another user's may name any place, the
    reader's own private remote too: exported "as his run's", her weights would land where he reads them. So
    another user's run is read from a remote of that user's, or from one whose owner record (REMOTE_OWNER, the
    sync's claim: a root-squashed share's, a team's) names this very run."""
    from minilmd.names import REMOTE_OWNER
    from minilmd.untrusted import Unreadable, read_json

    if run_uid == own_uid():
        return None
    try:
        place = os.stat(root)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"its run.remote {printable(str(root))} cannot be looked at ({printable(e.strerror or str(e))})"
    if owner_in(place, {run_uid}):
        return None
    try:
        record = checked(read_json(root / REMOTE_OWNER, max_bytes=OWNER_MAX_BYTES, owner=place.st_uid),
                         str(root / REMOTE_OWNER))
        if is_run(record, run_dir):
            return None
        named = f"its owner record names {describe(record)}"
    except (Unreadable, ValueError) as e:
        named = f"no owner record of it names this run ({printable(str(e))})"
    return (f"its run.remote {printable(str(root))} belongs to {user_words(place.st_uid)}, not to the run "
            f"directory's owner ({user_words(run_uid)}), and {named}: another user's run is read only from a "
            f"remote of theirs or of this run's")


def run_user(run_dir: Path, config: Path) -> int:
    """The user a run config's run is (for remote_not_the_runs): its run directory's owner, or, before that exists,
    the config file's; this user's when neither can be looked at."""
    from minilmd.perms import run_dir_owner

    if (owner := run_dir_owner(run_dir)) is not None:
        return owner
    try:
        return os.stat(config).st_uid
    except OSError:
        return own_uid()
