"""Where `minilmd status --all` finds the runs of this machine: a registry of run directories, one small file per
run, written by each supervisor when it starts.

Two places:
  per-user   $XDG_STATE_HOME/minilmd/runs/ (default ~/.local/state/minilmd/runs): the directory 0700, each entry
             0600 and written atomically; a user's own runs, <name>-<hash>.json.
  system     /var/lib/minilmd/runs (or $MINILMD_SYSTEM_REGISTRY), only if an admin made it, as root:root with mode
             1777 (sticky, like /tmp): every supervisor also leaves its entry there, <uid>-<name>-<hash>.json,
             owned by its own user. This is the variant for units started by root under `User=`, and lets root see
             every user's runs. A directory that is not root's (or the euid's), or not sticky, is never used.
<hash> is the start of the sha256 of the run directory. Anyone may write into the system registry, so:
  - a name is never trusted to be free: when another user made this run's name first (squatting), the run
    registers under <uid>-<name>-<hash>-<8 hex>.json and says so (an event); another user's file is never replaced;
  - an entry {"name", "run_dir", "config", "uid", "host", "registered"} is read through minilmd/untrusted.py: a
    regular file (no symlink, FIFO or device is opened), its owner checked before it is parsed, at most
    MAX_ENTRY_BYTES, a JSON object of little depth;
  - the user it speaks for is its file's owner, and its file name, its body's uid and its body's name and run
    directory must all agree with that (a forged or misnamed entry is unreadable, and said so);
  - its name is a run name (config.py's rule), so it never makes a path and never holds a control character;
  - a non-root reader reads only its own entries (by name first, then by owner); root reads everyone's;
  - the run directory it names must belong to its owner (or be gone; root's entries excepted): nobody can make
    another user's run show up as theirs; runs are told apart by (owner, run directory);
  - at most MAX_ENTRIES_PER_USER entries of one user are read, counted by their files' owner: once a uid has that
    many, the names that claim it are passed over unlooked at (a flood of a user's own costs the others one
    directory listing). Nothing is cut by a name's claim alone: anyone can make names claiming another's uid in
    the shared registry, and a cut by claim would hide that user's runs from him and from root.
What is skipped comes back as notes (`Scan.notes`, escaped for a terminal). Torch-free and light: `minilmd status`
imports it.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import socket
import stat
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from minilmd import names
from minilmd.fsio import atomic_write_text
from minilmd.perms import others_can_rearrange, own_uid, owned_by_me, owned_by_me_or_root, owner_in, user_words
from minilmd.untrusted import Unreadable, printable, read_json

MAX_ENTRY_BYTES = 64 * 1024
MAX_ENTRY_DEPTH = 4
MAX_ENTRIES_PER_USER = 1000
"""Entries of one user read per listing, per registry directory: a user has far fewer runs, a flood is cut here."""
NOTES_PER_USER = 3
"""Unreadable entries named one by one per user; the rest are counted."""
ENTRY_SUFFIX = ".json"
_UNIQUE = re.compile(r"-[0-9a-f]{8}")


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


@dataclass
class Scan:
    entries: list[Entry] = field(default_factory=list)
    """What the reader may see, once per (owner, run directory), sorted by name."""
    notes: list[str] = field(default_factory=list)
    """What was skipped and why (unreadable, shadowing, over the cap), escaped for a terminal."""


class RegistryUnsafe(RuntimeError):
    """A registry directory that must not be used (another user's, a symlink, not sticky)."""


def _own_private_dir(path: Path) -> None:
    """Create path (0700) if missing; refuse it unless it is a real directory of ours."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise RegistryUnsafe(f"{path} is not a directory (a symlink?): not used as the registry")
    if not owned_by_me(st):
        raise RegistryUnsafe(f"{path} belongs to uid {st.st_uid}, not to you: not used as the registry")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def _safe_shared_dir(path: Path) -> bool:
    """Whether the system registry exists and may be used: a real directory of root's (or our own, for tests run
    as a user), sticky when others may write to it."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or not owned_by_me_or_root(st):
        return False
    return not others_can_rearrange(st)



# --- writing ---------------------------------------------------------------------------------------------------

def register(name: str, run_dir: str | os.PathLike, config: str | os.PathLike, say=None) -> list[Path]:
    """Write this run's entry into the user's registry, and into the system one when it is there and safe.
    Returns the files written; raises OSError or RegistryUnsafe for the user's registry only. `say(message)` hears
    of a system entry name another user took first (the run is then registered under a fresh one)."""
    run_dir = Path(run_dir).resolve()
    body = json.dumps({"name": name, "run_dir": str(run_dir), "config": str(Path(config).resolve()),
                       "uid": own_uid(), "host": socket.gethostname(), "registered": round(time.time(), 3)},
                      sort_keys=True) + "\n"
    folder = user_dir()
    _own_private_dir(folder)
    written = [folder / entry_name(name, run_dir)]
    atomic_write_text(written[0], body, 0o600)  # in the user's own 0700 directory, whatever run.share says
    shared = system_dir()
    if _safe_shared_dir(shared):
        try:
            written.append(_register_shared(shared, name, run_dir, body, say or (lambda message: None)))
        except OSError:
            pass
    return written


def _register_shared(shared: Path, name: str, run_dir: Path, body: str, say) -> Path:
    """Our entry in the system registry: the usual name if it is free or ours, else a fresh one of ours (the one
    an earlier start chose, if any). Never replaces another user's file, not even as root."""
    uid = own_uid()
    path = shared / entry_name(name, run_dir, uid)
    taker = _taken_by(path, uid)
    if taker is None:
        if _publish(path, body, replace=path.exists()):
            return path
        taker = _taken_by(path, uid) or "another user"  # made just now, between our look and our link
    stem = entry_name(name, run_dir, uid)[:-len(ENTRY_SUFFIX)]
    earlier = [p for p in sorted(shared.glob(f"{glob_escape(stem)}-*{ENTRY_SUFFIX}"))
               if _UNIQUE.fullmatch(p.name[len(stem):-len(ENTRY_SUFFIX)]) and _taken_by(p, uid) is None]
    fresh = earlier[0] if earlier else shared / f"{stem}-{secrets.token_hex(4)}{ENTRY_SUFFIX}"
    if not _publish(fresh, body, replace=bool(earlier)):
        raise FileExistsError(f"{fresh} was taken too")
    say(f"the system registry entry {printable(path)} belongs to {taker}, who made it first: this run is "
        f"registered as {printable(fresh.name)} instead")
    return fresh


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _taken_by(path: Path, uid: int) -> str | None:
    """Who has path if it is not free for us: another user's file, or anything that is not a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not owner_in(st, (uid,)):
        return user_words(st.st_uid)
    return None if stat.S_ISREG(st.st_mode) else f"something that is not a regular file ({user_words(st.st_uid)})"


def _publish(path: Path, body: str, replace: bool) -> bool:
    """Write body to path (0644) atomically (fsio.atomic_write_text, no fsync: rewritten at every start): over our own
    file when replace (another user cannot have replaced it in a sticky directory), else only if the name is free.
    False when the name was taken."""
    try:
        atomic_write_text(path, body, mode=0o644, durable=False, replace=replace)
    except FileExistsError:
        return False
    return True


def register_quietly(name: str, run_dir: Path, config: str | os.PathLike, emit) -> None:
    """register(), for the supervisor: a registry it cannot write is said once and never stops the run; a name
    another user took first is said too."""
    try:
        register(name, run_dir, config, say=lambda message: emit("registry", message))
    except (OSError, RegistryUnsafe) as e:
        emit("registry", f"not registered for `minilmd status --all`: {e}")


# --- reading ---------------------------------------------------------------------------------------------------

def _read_entry(path: Path, st: os.stat_result, shared: bool) -> Entry:
    """The entry in path, as lstat saw it (its owner); Unreadable when it is not one, or does not agree with its name.
    In the system registry an entry's name begins with its owner's uid: one of another uid is not read."""
    owner = st.st_uid
    if shared and ((claimed := _claimed_uid(path.name)) is None or not owner_in(st, {claimed})):
        raise Unreadable(f"named for uid {printable(path.name.split('-', 1)[0])} but belongs to uid {owner}", path,
                         kind="owner")
    body = read_json(path, max_bytes=MAX_ENTRY_BYTES, max_depth=MAX_ENTRY_DEPTH, owner=owner)
    name, run_dir, uid = body.get("name"), body.get("run_dir"), body.get("uid")
    if not isinstance(name, str) or not names.RUN_NAME.fullmatch(name):
        raise Unreadable("its name is not a run name", path)
    if not isinstance(run_dir, str) or not run_dir.startswith("/"):
        raise Unreadable("its run_dir is not an absolute path", path)
    if type(uid) is not int or not owner_in(st, {uid}):
        raise Unreadable(f"says uid {printable(repr(uid))} but belongs to uid {owner}", path)
    stem = entry_name(name, Path(run_dir), owner if shared else None)[:-len(ENTRY_SUFFIX)]
    rest = path.name[len(stem):-len(ENTRY_SUFFIX)] if path.name.startswith(stem) else None
    if rest is None or (rest and not _UNIQUE.fullmatch(rest)):
        raise Unreadable("its file name disagrees with the run it names", path)
    registered = body.get("registered")
    config = body.get("config")
    return Entry(name, Path(run_dir), config if isinstance(config, str) else "", owner, path,
                 float(registered) if type(registered) in (int, float) else 0.0)


def _run_dir_stat(run_dir: Path) -> os.stat_result | None:
    """The registered run directory, followed (stat, not lstat: a link of the entry's owner to another user's run
    directory must count as that user's, whom the entry does not speak for); None when it is not there."""
    try:
        return os.stat(run_dir)
    except OSError:
        return None


def _entries_in(folder: Path, reader_uid: int, shared: bool, notes: list[str]) -> list[Entry]:
    """The readable entries in folder a reader may see; notes say what was skipped."""
    prefix = f"{reader_uid}-" if shared and reader_uid != 0 else ""
    try:
        with os.scandir(folder) as listing:
            listed = sorted(e.name for e in listing if e.name.endswith(ENTRY_SUFFIX) and not e.name.startswith(".")
                            and e.name.startswith(prefix))
    except OSError:
        return []
    per_user: Counter[int] = Counter()
    passed_over: Counter[int] = Counter()
    unreadable: dict[int, list[str]] = defaultdict(list)
    found = []
    for file_name in listed:
        if shared and (claimed := _claimed_uid(file_name)) is not None and per_user[claimed] >= MAX_ENTRIES_PER_USER:
            passed_over[claimed] += 1  # its owner's own files have filled the cap: the rest is his, or refused
            continue
        path = folder / file_name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if reader_uid != 0 and not owner_in(st, {reader_uid}):
            continue  # another user's file under our name: never read
        owner = st.st_uid
        per_user[owner] += 1
        if per_user[owner] > MAX_ENTRIES_PER_USER:
            continue
        try:
            entry = _read_entry(path, st, shared)
        except Unreadable as e:
            unreadable[owner].append(f"{printable(file_name)} ({e.why})")
            continue
        run_dir_st = _run_dir_stat(entry.run_dir)
        if entry.uid != 0 and run_dir_st is not None and not owner_in(run_dir_st, {entry.uid}):
            notes.append(f"{printable(path)}: the entry of {user_words(entry.uid)} names a run directory of "
                         f"{user_words(run_dir_st.st_uid)} ({printable(entry.run_dir)}): ignored")
            continue
        found.append(entry)
    for owner, whys in sorted(unreadable.items()):
        more = f"; and {len(whys) - NOTES_PER_USER} more" if len(whys) > NOTES_PER_USER else ""
        notes.append(f"{printable(folder)}: {len(whys)} entr{'y' if len(whys) == 1 else 'ies'} of {user_words(owner)} "
                     f"unreadable, skipped: {'; '.join(whys[:NOTES_PER_USER])}{more}")
    for owner, count in sorted((per_user + passed_over).items()):
        if count > MAX_ENTRIES_PER_USER:
            notes.append(f"{printable(folder)}: {user_words(owner)} has {count} entries (or names claiming him), "
                         f"more than any user needs: only the first {MAX_ENTRIES_PER_USER} (by name) are read")
    return found


def _claimed_uid(file_name: str) -> int | None:
    """The uid a system registry entry's name claims (<uid>-...), None when it claims none: only a claim, which its
    file's owner must bear out when it is read."""
    head = file_name.split("-", 1)[0]
    return int(head) if head.isascii() and head.isdigit() and len(head) < 12 else None


def _all_entries(reader_uid: int, notes: list[str]) -> list[Entry]:
    """Every entry the reader may see, in both places (the user's own registry if it is theirs, then the system
    one if it is safe), duplicates included."""
    found: list[Entry] = []
    mine = user_dir()
    try:
        st = os.lstat(mine)
        if stat.S_ISDIR(st.st_mode) and owner_in(st, (reader_uid,)):
            found += _entries_in(mine, reader_uid, False, notes)
    except OSError:
        pass
    if _safe_shared_dir(system_dir()):
        found += _entries_in(system_dir(), reader_uid, True, notes)
    return found


def scan(reader_uid: int | None = None) -> Scan:
    """Every run this user may see, once each (by owner and run directory), sorted by name, and the notes."""
    uid = own_uid() if reader_uid is None else reader_uid
    result = Scan()
    unique: dict[tuple[int, str], Entry] = {}
    for entry in _all_entries(uid, result.notes):
        unique.setdefault((entry.uid, str(entry.run_dir)), entry)
    result.entries = sorted(unique.values(), key=lambda e: (e.name, str(e.run_dir), e.uid))
    return result


def entries(reader_uid: int | None = None) -> list[Entry]:
    return scan(reader_uid).entries


@dataclass
class Forgotten:
    removed: list[Path] = field(default_factory=list)
    """The entry files removed."""
    kept: list[Entry] = field(default_factory=list)
    """Entries named by the target's name whose run directory still exists: kept (only its path forgets it)."""


def forget(target: str, as_dir: str | None = None) -> Forgotten:
    """Remove this user's entries of the run named target, or of the run directory target. By name, only the
    entries whose run directory is gone: a name is not unique (every demo is `demo`), and one of them may be a run
    that is training now; those are kept, and returned, so that the caller says so (`minilmd forget RUN_DIR` removes
    one). Only files found in the registry directories are touched, never a path made from a name; only those the
    user owns (root's forget removes anyone's). `as_dir`: the real path of the run directory target names, reached
    by the caller under runarg's link rule (daemon/views/runarg.py real_path; never a resolve() here, which followed
    another user's link to a third user's live run)."""
    uid = own_uid()
    found = _all_entries(uid, [])
    by_dir = {(e.uid, str(e.run_dir)) for e in found if str(e.run_dir) == as_dir}
    by_name = {(e.uid, str(e.run_dir)): e for e in found if e.name == target and (e.uid, str(e.run_dir)) not in by_dir}
    out = Forgotten(kept=[e for e in by_name.values() if _run_dir_stat(e.run_dir) is not None])
    runs = by_dir | {run for run, e in by_name.items() if e not in out.kept}
    for entry in found:
        if (entry.uid, str(entry.run_dir)) not in runs or entry.path.parent not in (user_dir(), system_dir()):
            continue
        try:
            st = os.lstat(entry.path)
            if uid != 0 and not owner_in(st, (uid,)):
                continue
            os.unlink(entry.path)
            out.removed.append(entry.path)
        except OSError:
            continue
    return out
