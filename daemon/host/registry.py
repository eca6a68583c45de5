"""Where `minilmd status --all` finds the runs of this machine: a registry of run directories, one small file per
run, written by each supervisor when it starts.

Two places:
  per-user   $XDG_STATE_HOME/minilmd/runs/ (default ~/.local/state/minilmd/runs): the directory 0700, each entry
             0600 and written atomically; a user's own runs.
  system     /var/lib/minilmd/runs (or $MINILMD_SYSTEM_REGISTRY), only if an admin made it, as root:root with mode
             1777 (sticky, like /tmp): every supervisor also leaves its entry there, <uid>-<name>-<hash>.json,
             owned by its own user. This is the variant for units started by root under `User=`, and lets root see
             every user's runs. A directory that is not root's (or the euid's), or not sticky, is never written to.

An entry is {"name", "run_dir", "config", "uid", "host", "registered"}. The safety rules when reading:
  - an entry is opened with O_NOFOLLOW and must be a regular file of at most MAX_ENTRY_BYTES: a symlink or a FIFO
    planted by another user is skipped, never followed;
  - the user an entry speaks for is its file's owner (st_uid), not what it says; a non-root reader takes only its
    own entries, root takes everyone's;
  - the run directory it names must belong to that same user: nobody can make another user's run show up as
    theirs (and status reads that run directory's state.json with the reader's own permissions anyway);
  - the per-user directory must be the reader's own and not a symlink.
Torch-free and light: `minilmd status` imports it.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from minilmd import names
from minilmd.fsio import atomic_write_text

MAX_ENTRY_BYTES = 64 * 1024
ENTRY_SUFFIX = ".json"


def user_dir() -> Path:
    """This user's registry: $XDG_STATE_HOME/minilmd/runs, ~/.local/state/minilmd/runs without it."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / names.USER_REGISTRY


def system_dir() -> Path:
    return Path(os.environ.get(names.SYSTEM_REGISTRY_ENV) or names.SYSTEM_REGISTRY)


def _key(run_dir: Path) -> str:
    return hashlib.sha256(str(run_dir).encode()).hexdigest()[:12]


def entry_name(name: str, run_dir: Path, uid: int | None = None) -> str:
    """<name>-<hash of run_dir>.json; in the system registry <uid>- before it (two users' runs of one name)."""
    return (f"{uid}-" if uid is not None else "") + f"{name}-{_key(run_dir)}{ENTRY_SUFFIX}"


@dataclass(frozen=True)
class Entry:
    name: str
    run_dir: Path
    config: str
    uid: int
    """The owner of the entry's file: the user it speaks for."""
    path: Path
    """The entry's file."""
    registered: float = 0.0


class RegistryUnsafe(RuntimeError):
    """A registry directory that must not be used (another user's, a symlink, not sticky)."""


def _own_private_dir(path: Path) -> None:
    """Create path (0700) if missing; refuse it unless it is a real directory of ours."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise RegistryUnsafe(f"{path} is not a directory (a symlink?): not used as the registry")
    if st.st_uid != os.geteuid():
        raise RegistryUnsafe(f"{path} belongs to uid {st.st_uid}, not to you: not used as the registry")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def _safe_shared_dir(path: Path) -> bool:
    """Whether the system registry exists and may be written to: a real directory of root's (or our own, for
    tests run as a user), sticky when others may write to it."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid()):
        return False
    return not (st.st_mode & 0o022) or bool(st.st_mode & stat.S_ISVTX)


def register(name: str, run_dir: str | os.PathLike, config: str | os.PathLike) -> list[Path]:
    """Write this run's entry into the user's registry, and into the system one when it is there and safe.
    Returns the files written; raises OSError or RegistryUnsafe for the user's registry only."""
    run_dir = Path(run_dir).resolve()
    body = json.dumps({"name": name, "run_dir": str(run_dir), "config": str(Path(config).resolve()),
                       "uid": os.geteuid(), "host": socket.gethostname(), "registered": round(time.time(), 3)},
                      sort_keys=True) + "\n"
    folder = user_dir()
    _own_private_dir(folder)
    written = [folder / entry_name(name, run_dir)]
    atomic_write_text(written[0], body)  # 0600
    shared = system_dir()
    if _safe_shared_dir(shared):
        path = shared / entry_name(name, run_dir, os.geteuid())
        try:
            atomic_write_text(path, body, mode=0o644)  # a rename over another user's file fails: sticky
            written.append(path)
        except OSError:
            pass
    return written


def register_quietly(name: str, run_dir: Path, config: str | os.PathLike, emit) -> None:
    """register(), for the supervisor: a registry it cannot write is said once and never stops the run."""
    try:
        register(name, run_dir, config)
    except (OSError, RegistryUnsafe) as e:
        emit("registry", f"not registered for `minilmd status --all`: {e}")


def _read_entry(path: Path) -> Entry | None:
    """The entry in path, or None: a symlink, a non-regular file, a big or broken one (never followed or trusted)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
            return None
        raw = os.read(fd, MAX_ENTRY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        body = json.loads(raw)
        return Entry(str(body["name"]), Path(body["run_dir"]), str(body.get("config", "")), st.st_uid, path,
                     float(body.get("registered") or 0.0))
    except (ValueError, KeyError, TypeError):
        return None


def _run_dir_owner(run_dir: Path) -> int | None:
    try:
        return os.stat(run_dir).st_uid
    except OSError:
        return None


def visible(entry: Entry, reader_uid: int) -> bool:
    """Whether a reader may see this entry: root sees all; anyone else only entries of their own, naming a run
    directory of their own (or one that vanished)."""
    if reader_uid == 0:
        return True
    if entry.uid != reader_uid:
        return False
    owner = _run_dir_owner(entry.run_dir)
    return owner is None or owner == reader_uid


def _entries_in(folder: Path, reader_uid: int) -> list[Entry]:
    try:
        names_here = sorted(os.listdir(folder))
    except OSError:
        return []
    found = []
    for name in names_here:
        if not name.endswith(ENTRY_SUFFIX) or name.startswith("."):
            continue
        entry = _read_entry(folder / name)
        if entry is not None and visible(entry, reader_uid):
            found.append(entry)
    return found


def entries(reader_uid: int | None = None) -> list[Entry]:
    """Every run this user may see, once each (by run directory), sorted by name: the user's own registry (if it
    is theirs), then the system registry."""
    uid = os.geteuid() if reader_uid is None else reader_uid
    found: list[Entry] = []
    mine = user_dir()
    try:
        st = os.lstat(mine)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            found += _entries_in(mine, uid)
    except OSError:
        pass
    found += _entries_in(system_dir(), uid)
    unique: dict[str, Entry] = {}
    for entry in found:
        unique.setdefault(str(entry.run_dir), entry)
    return sorted(unique.values(), key=lambda e: (e.name, str(e.run_dir)))


def forget(target: str) -> list[Path]:
    """Remove this user's entries of the run named target, or of the run directory target; returns the files
    removed. Only files the user owns are touched (the system registry is sticky; root's forget removes any)."""
    uid = os.geteuid()
    as_dir = str(Path(target).resolve()) if ("/" in target or Path(target).exists()) else None
    removed = []
    for entry in entries(uid):
        if entry.name != target and str(entry.run_dir) != as_dir:
            continue
        paths = [entry.path]
        for folder, owner in ((user_dir(), None), (system_dir(), entry.uid)):  # the run's entry in the other place
            paths.append(folder / entry_name(entry.name, entry.run_dir, owner))
        for path in dict.fromkeys(paths):
            try:
                st = os.lstat(path)
                if uid not in (0, st.st_uid):
                    continue
                os.unlink(path)
                removed.append(path)
            except OSError:
                continue
    return removed
