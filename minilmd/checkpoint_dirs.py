"""Checkpoint roots as directories: which checkpoints a root holds, what LATEST and BEST name, setting a damaged one
aside, the debris of a writer that died. Nothing here reads a checkpoint's contents (minilmd/checkpoint.py
validates them), so this module imports no numpy: `minilmd status` and init.from's lineage find checkpoints through
it and stay fast. Torch-free.
"""
from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

from minilmd import leftovers
from minilmd.dirfd import Dir
from minilmd.dirtree import OPEN_DIR
from minilmd.names import (
    BEST,
    LATEST,
    MANIFEST,
    POINTER_MAX_BYTES,
    QUARANTINE,
    REASON_FILE,
    is_step_name,
    quarantine_name,
    step_of,
)
from minilmd.perms import own_link, owned_by_me
from minilmd.tmpnames import root_tmp_maker
from minilmd.untrusted import Unreadable, listed, printable, read_bytes


class PointerError(ValueError):
    """A pointer file (ROOT/LATEST, ROOT/BEST) that names no checkpoint directory."""


def read_latest(root: str | os.PathLike, pointer: str = LATEST) -> str | None:
    """The directory name `LATEST` (or another pointer file: BEST) points to, or None when there is none yet (or
    it is not a small regular file: a pointer is written by rename, never a link, a FIFO or a directory)."""
    try:
        name = read_bytes(Path(root) / pointer, max_bytes=POINTER_MAX_BYTES).decode("utf-8").strip()
    except (Unreadable, UnicodeDecodeError):
        return None
    return name or None


def named_checkpoint(path: str | os.PathLike) -> Path:
    """What a path given for a checkpoint means: a pointer file (ROOT/LATEST, ROOT/BEST) stands for the step
    directory it names, as if that directory had been given; any other path is itself. The one resolver of
    `verify`, `init.from`, `sample` and `export`. PointerError when a pointer names no step directory."""
    path = Path(path)
    if path.name not in (LATEST, BEST) or not os.path.lexists(path) or path.is_dir():
        return path
    name = read_latest(path.parent, path.name)
    if name is None or not is_step_name(name):
        raise PointerError(f"{printable(path)} names no checkpoint ({printable(repr(name))[:80]}, not a "
                           f"step-XXXXXXXX name)")
    if why := not_the_roots(path.parent / name):
        raise PointerError(f"{printable(path)} names {name}, which is {why}: not one of this root's checkpoints")
    if not (path.parent / name / MANIFEST).is_file():
        raise PointerError(f"{printable(path)} names {name}, which holds no {MANIFEST}")
    return path.parent / name


def read_best(root: str | os.PathLike) -> str | None:
    """The directory name `BEST` points to (the best validation of an early_stop run, by its early_stop.metric), or
    None."""
    return read_latest(root, BEST)


def local_checkpoint_steps(root: str | os.PathLike) -> list[int]:
    """Steps of list_checkpoints (cheap: names only, no validation); none when root cannot be read."""
    try:
        return [step_of(p.name) for p in list_checkpoints(root)]
    except OSError:
        return []


def list_checkpoints(root: str | os.PathLike, passed_by: dict[str, str] | None = None) -> list[Path]:
    """Step directories holding a manifest, oldest first. Temporary and manifest-less ones do not exist here, nor
    does an entry by a step name that is not the root's own (not_the_roots: a symbolic link, another user's
    directory): in a root others can write, a planted step-99999999 would otherwise be its newest checkpoint, the
    one resumed, exported or sampled. Those are put in `passed_by` (name: why) when given, for the caller to say.
    A root of more entries than untrusted.listed reads (a remote's, filled by someone) raises its TooManyEntries,
    an OSError as an unreadable root's: never listed whole, nor taken for one holding none."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for name in listed(root):
        if not is_step_name(name):
            continue
        p = root / name
        if why := not_the_roots(p):
            if passed_by is not None:
                passed_by[p.name] = why
        elif (p / MANIFEST).is_file():
            found.append(p)
    return sorted(found, key=step_of)


def not_the_roots(step_dir: Path) -> str | None:
    """Why an entry by a step name is no checkpoint of its root (None: it is one, or is not there): a symbolic link
    (its files are another place's, free to change), or a directory owned by neither the root's owner nor this user
    (someone else's, planted). The root's owner, not only this user: exporting another user's run root reads their
    checkpoints; and a share that maps this user to another uid (NFS root_squash) owns the root it made as well."""
    try:
        st = os.lstat(step_dir)
        root_uid = os.stat(step_dir.parent).st_uid
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"not to be looked at ({e.strerror or e})"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if not owned_by_me(st, also=(root_uid,)):
        return f"owned by uid {st.st_uid} (the root is uid {root_uid}'s)"
    return None


def quarantine(ckpt_dir: str | os.PathLike, reason: str) -> Path:
    """Move a bad checkpoint aside to <root>/quarantine/<name>-<time>/ with a reason.txt; nothing is deleted."""
    ckpt_dir = Path(ckpt_dir)
    qdir = ckpt_dir.parent / QUARANTINE
    qdir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    n = 1
    while (dest := qdir / quarantine_name(ckpt_dir.name, stamp, n)).exists():
        n += 1
    os.rename(ckpt_dir, dest)
    (dest / REASON_FILE).write_text(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {reason}\n", encoding="utf-8")
    return dest


_WORDS = leftovers.Words(one="a checkpoint writer", tool="checkpoint writer", thing="temporary directory",
                         files=False)


def clean_stale_tmp(root: str | os.PathLike, say: leftovers.Say | None = None) -> list[Path]:
    """Remove `.tmp-*` directories left by a writer that died (no process of its pid, start time and boot runs:
    proc_info.process_alive, tmpnames.root_tmp_maker; or its pid is this process's: only one trainer writes a root at a
    time, so the name's pid running here is ours). Returns those removed. A temp directory of another live process is
    left alone. Only this user's own real directories are removed: a symbolic link, another user's entry (a root may sit
    in a directory others can write, where unlink needs no ownership) are left, and said (`say`, default stderr;
    leftovers.sweep); anything but a directory or a link by such a name (a writer's temporary file) is passed by unsaid.
    The root is opened once, and everything is looked at and removed through that descriptor; a link at its name is
    followed only when it is the user's own (or root's: perms.own_link, the rule of Dir.open) and leads to a directory
    of the user's (scratch/checkpoints linked to a bigger disk, which list_checkpoints follows too), else nothing is
    swept and that is said; a root that cannot be opened (none yet): nothing."""
    root = Path(root)
    say = say or leftovers.stderr_say("checkpoints")
    at: Dir | None
    try:
        at = Dir(os.open(root, OPEN_DIR), root)
    except OSError as e:
        at = _own_linked_root(root, say) if e.errno in (errno.ELOOP, errno.ENOTDIR) else None
    if at is None:
        return []
    with at:
        return leftovers.sweep(at, _tmp_maker, _WORDS, say, out=root,
                               mine_is_dead=True, only_dirs_and_links=True)


def _own_linked_root(root: Path, say: leftovers.Say) -> Dir | None:
    """The checkpoint root through the link at its name when that link is the user's own (or root's) and its target
    a directory of the user's, opened once: what is swept is what that descriptor holds. Else None, and why nothing
    is swept is said (once: a trainer sweeps once, at its start)."""
    try:
        link = os.lstat(root)
    except OSError:
        return None
    if not stat.S_ISLNK(link.st_mode):
        return None  # a file by the root's name: not a root
    if not own_link(link):
        say(f"{root}: a symbolic link of another user's (uid {link.st_uid}): not followed, so killed saves' "
            f"temporary directories there are not swept")
        return None
    try:
        fd = os.open(root, OPEN_DIR & ~os.O_NOFOLLOW)
    except OSError:
        return None  # a link to nowhere: no root yet
    target = os.fstat(fd)
    if not owned_by_me(target):
        os.close(fd)
        say(f"{root}: links to a directory of another user's (uid {target.st_uid}): killed saves' temporary "
            f"directories there are not swept")
        return None
    return Dir(fd, root)


def _tmp_maker(name: str) -> leftovers.Maker | None:
    """A `.tmp-...` name's maker (tmpnames.root_tmp_maker): this host's, since a root's writers are local."""
    maker = root_tmp_maker(name)
    return None if maker is None else (None, *maker)
