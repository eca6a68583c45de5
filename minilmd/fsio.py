"""File I/O that must survive a crash or a kill at any instant, and the few checks every part shares.

- Writing: `atomic_write_text`/`atomic_write_json` (one file) and `publish_dir` (a whole directory, by
  minilmd/dirpublish.py's `publish` at its parent's descriptor): a reader sees the old version or the new one,
  never a half, and after a power loss the new one is there or nothing is.
- Swapping two entries at once by path (`exchange`: renameat2's RENAME_EXCHANGE where the file system does it); in
  a place others write, minilmd/dirfd.py's Dir renames at a descriptor.
- Checking: `table_problems` compares files against a table `{name: {"size", "sha256"}}` (a checkpoint's
  manifest, a prepared corpus's meta.json), through callbacks so that remote copies are checked the same way.
- Refusing an --out that is there already without --force (`out_taken`: prepare, export, tokenizer train, demo-corpus).
- Writing a file a user names (`write_out_text`/`write_out_bytes`: tokenizer train, plot) at the descriptor of
  its directory, opened once under the place rule (`open_out_parent`; a directory the user names: `open_out_dir`),
  never over another user's file (`others_entry`).
- A full disk or quota: `is_disk_full` (ENOSPC, EDQUOT), the one test every part asks.
Reading a log others may write is minilmd/logread.py. Torch-free; the supervisor imports it.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from minilmd import dirfd, perms
from minilmd.dirfd import RENAME_EXCHANGE
from minilmd.dirpublish import publish
from minilmd.place_rule import walk_problem, walk_to
from minilmd.proc_info import this_process
from minilmd.tmpnames import atomic_tmp_prefix, replaced_name
from minilmd.untrusted import Unreadable, file_kind, sha256_regular

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
"""No room (the file system's, or the user's quota): the write would fit elsewhere, or later; nothing is wrong with
the file itself. The one list: the supervisor, the trainer, prepare and export ask is_disk_full."""


def is_disk_full(e: BaseException) -> bool:
    """ENOSPC or EDQUOT (DISK_FULL_ERRNOS)."""
    return isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS


def dir_removed(e: OSError, directory: str | os.PathLike) -> bool:
    """Whether `e` failed a write in `directory` because the directory itself is gone (an `rm -r` of run.dir while
    the run runs): said and stopped for as a full run.dir is, by the supervisor (daemon/phases/rundirwatch.py) and the
    trainer (minilmd/metrics.py RunDirWrites), never a traceback. The one rule of both."""
    return e.errno == errno.ENOENT and not os.path.isdir(directory)


def no_inode_left(vfs: os.statvfs_result) -> bool:
    """Whether a file system is full of inodes, not of bytes (its ENOSPC with bytes to spare: freeing bytes would not
    help): it counts inodes (f_files; 0 where they are made as needed, as on btrfs and many NFS servers) and has none
    left for an unprivileged user (f_favail). The one rule of every message that names what ran out."""
    return bool(vfs.f_files) and not vfs.f_favail


def inodes_if_none_left(path: str | os.PathLike) -> int | None:
    """The inode count of path's file system when none is left for a new file (no_inode_left); None otherwise, or
    when it cannot be measured."""
    try:
        vfs = os.statvfs(path)
    except OSError:
        return None
    return vfs.f_files if no_inode_left(vfs) else None


# --- writing ------------------------------------------------------------------------------------------------------

def out_taken(out: str | os.PathLike, force: bool, there: bool | None = None) -> str | None:
    """Why a command must not write --out: something is there already (a file, a directory, a link) and --force was
    not given. One rule for every command that writes an --out (`prepare`, `export`, `tokenizer train`). `there`:
    what the caller found at --out through a directory's descriptor (None: looked up here, by its path)."""
    if force or not (os.path.lexists(out) if there is None else there):
        return None
    return f"{out} already exists; pass --force to replace it"


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file's data, or a directory's entries, to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in this directory durable (a file's own fsync does not cover its name)."""
    fsync_file(path)


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None, tag: str = "",
                      durable: bool = True, replace: bool = True) -> None:
    """Write a file so that a reader sees the old content or the new, never a half: temp file, fsync, rename.
    The directory is not fsynced (state.json is rewritten every second): after a power loss the old content
    may be back; callers that need the name itself durable fsync_dir the parent. The file gets `mode`, by default
    what open() would give under the process umask, which carries the file permissions policy (minilmd/perms.py:
    0600 unless the run or export shares it), set on the temp file before the rename: no moment with another.
    `tag` goes into the temp file's name, for a directory where a writer must know its own leftovers. The temp file
    is made new under a name no one can guess (mkstemp: O_EXCL, never a planted link followed). `durable=False`
    skips the fsync (a file rewritten every few seconds, whose loss costs nothing: the heartbeat, a registry entry).
    `replace=False` puts the file at `path` only while the name is free (a hard link of the temp file, which fails
    where a rename would replace): FileExistsError when it is taken."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=atomic_tmp_prefix(path.name) + tag, suffix=".tmp", dir=path.parent)
    mode = perms.file_mode() if mode is None else mode
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if mode != 0o600:  # mkstemp's
                os.fchmod(f.fileno(), mode)
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
            tmp = ""
        else:
            os.link(tmp, path)  # FileExistsError when the name is taken
    finally:
        if tmp:  # not renamed: failed, or linked (path holds the file now)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def publish_dir(tmp_dir: str | os.PathLike, final_dir: str | os.PathLike, aside: str | os.PathLike | None = None,
                ) -> Path:
    """Put a complete temporary directory in place of `final_dir` (beside it: the same parent), durably; returns
    `final_dir`. For a caller that holds paths in a place of its own (scratch): the parent is opened once and the
    work is minilmd/dirpublish.py's `publish`, the one publication, through descriptors.

    Every file and directory under tmp_dir is fsynced, then tmp_dir itself (never a link followed, never a FIFO
    opened); an existing final_dir (the directory there when this began: identities checked on both sides, dirfd's
    Replaced otherwise) is swapped with tmp_dir in one step (RENAME_EXCHANGE: the old version then lies at
    tmp_dir's name, removed after), so that a reader, and a kill at any moment, sees the old version or the new one,
    never none. Where the file system cannot swap (NFS), the old version is renamed to `aside` (a name beside it;
    default: tmpnames.replaced_name's `.tmp-replaced-<name>-<pid>-<ticks>-boot<tag>`) and put back when the second
    rename fails or is interrupted (SIGTERM): a caller's clean-up of leftovers would take an aside whose maker is
    gone for debris, and with it the only version there was. Then the parent is fsynced."""
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    if tmp_dir.parent != final_dir.parent or (aside is not None and Path(aside).parent != final_dir.parent):
        raise ValueError(f"{tmp_dir}: published only beside {final_dir} (a rename in one directory)")
    aside_name = Path(aside).name if aside is not None else replaced_name(final_dir.name, *this_process())
    with dirfd.Dir(os.open(final_dir.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), final_dir.parent) as parent:
        tmp = dirfd.Dir.at(parent, tmp_dir.name)
        try:
            publish(parent, tmp, tmp_dir.name, final_dir.name, parent.identity_of(final_dir.name), aside_name)
        finally:
            tmp.close()
    return final_dir


# --- renaming by path, renameat2's flags where the file system does them --------------------------------------------

def renameat2(src: str | os.PathLike, dst: str | os.PathLike, flags: int) -> bool:
    """Linux's renameat2(2) of src to dst with `flags`, by path (minilmd/dirfd.py's, the one home of the call):
    True when done; False when this kernel, libc or file system does not do those flags (EINVAL from NFS,
    ENOSYS, no renameat2 at all): the caller's fallback then. Any other failure raises as os.rename's does
    (FileExistsError for RENAME_NOREPLACE onto a name taken)."""
    return dirfd.renameat2(dirfd.AT_FDCWD, src, dirfd.AT_FDCWD, dst, flags)


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap the entries at a and b in one step (RENAME_EXCHANGE; both must exist): True when swapped, False where
    the file system does not do it (NFS), nothing changed then."""
    return renameat2(a, b, RENAME_EXCHANGE)

# --- checking -----------------------------------------------------------------------------------------------------

OUT_DIR_MODE = 0o755
"""The directories made on the way to an output's directory: never writable by others whatever the umask (the
place rule would refuse them)."""


def out_parent_problem(out: str | os.PathLike, label: str, what: str, advice: str, *,
                       group_share: bool = False) -> str | None:
    """Why open_out_parent would refuse the directory of `out`, said before the work (plot's runs read, a tokenizer
    trained, an export converted), nothing made: its very walk with nothing made (place_rule.walk_problem), so the
    check and the write give one answer however `out` is spelled (by path, abspath read `a/link/../out` as
    `a/out`, where the walk, as the kernel, goes up from where the link leads). A file in the way: the write says it."""
    return walk_problem(Path(out).parent, f"the directory of {label}", what, advice, group_share=group_share)


def open_out_parent(out: Path, label: str, what: str, advice: str, *, group_share: bool = False) -> dirfd.Dir:
    """The directory of an output `out` (export's --out, tokenizer train's), under the place rule (a link on the way
    followed only when root's or ours; `group_share` waives the rule for that directory alone: a team directory),
    judged, made when missing and opened in one walk (place_rule.walk_to: each missing directory made at its judged
    parent's descriptor, never by a path a link planted meanwhile would lead elsewhere), after out_parent_problem,
    that walk with nothing made, whose words a refusal takes (a directory on the way without search permission
    said so, exit 2, not a failed write): the output is then written at that descriptor, never by a name another
    user could turn into a link to the victim's files. PlaceRefused when refused (the message ends with `advice`; a
    file in the way: "is a file, not a directory"), nothing made past the refusal; any other OSError as walk_to
    raises it (a full disk, no permission), naming the full path."""
    if problem := out_parent_problem(out, label, what, advice, group_share=group_share):
        raise dirfd.PlaceRefused(problem)
    fd, _ = walk_to(out.parent, f"the directory of {label}", what, advice, OUT_DIR_MODE, group_share=group_share)
    return dirfd.Dir(fd, out.parent)  # the path only names it in messages: as the user wrote it



def open_out_dir(out_dir: Path, label: str, what: str, advice: str, *, group_share: bool = False) -> dirfd.Dir:
    """An output directory the user names (demo-corpus's OUT), itself under the place rule too (a link there
    followed only when root's or ours; `group_share`: it may be a team directory), judged and made when missing
    in the same walk that opens it, after that walk with nothing made (walk_problem, as open_out_parent: one rule,
    never a mkdir by path, which a link planted after a judgement would lead elsewhere): its files are then written
    at that descriptor (Dir.replacing). PlaceRefused when refused, nothing made past the refusal; OSError as it
    comes."""
    if problem := walk_problem(out_dir, label, what, advice, group_share=group_share):
        raise dirfd.PlaceRefused(problem)
    fd, _ = walk_to(out_dir, label, what, advice, OUT_DIR_MODE, group_share=group_share)
    return dirfd.Dir(fd, out_dir)  # the path only names it in messages: as the user wrote it


def write_out_text(out: Path, text: str, label: str, what: str, advice: str, *, group_share: bool = False,
                   mode: int | None = None) -> None:
    """`out` replaced whole by `text` (a temp file, fsync, rename: a reader sees the old or the new), written at
    the descriptor of its directory opened by `open_out_parent` (its rule, its PlaceRefused): a link of ours at `out`
    is replaced, never followed; another user's entry there (a file, a link, anything) is never replaced:
    PlaceRefused naming its owner (`others_entry`); a link planted on the way is refused or not followed. The file's
    mode is `mode`, else the permissions policy's (perms.file_mode)."""
    write_out_bytes(out, text.encode("utf-8"), label, what, advice, group_share=group_share, mode=mode)


def write_out_bytes(out: Path, data: bytes, label: str, what: str, advice: str, *, group_share: bool = False,
                    mode: int | None = None) -> None:
    """write_out_text's rule for bytes (plot's picture, rendered in memory first). Another user's entry at `out`
    (a file, a link, anything) is never replaced: PlaceRefused naming its owner (`others_entry`)."""
    with open_out_parent(out, label, what, advice, group_share=group_share) as parent:
        if held := others_entry(parent, out):
            raise dirfd.PlaceRefused(held)
        parent.write_atomic(out.name, data, perms.file_mode() if mode is None else mode)


def others_entry(parent: dirfd.Dir, out: Path) -> str | None:
    """Why `out` (in `parent`, looked at through its descriptor, no link followed) is not to be replaced: it is
    another user's, said with its owner; None when nothing is there or it is ours. A team directory (--group-share)
    lets a member rename over a teammate's file, so before, `plot --out` replaced his figure silently, where a
    sticky directory refused it (dirfd.NameHeld); now refused here too, --force or not: his file is his to remove
    (hostile audit 7 F3). In a sticky directory the kernel's refusal is left to say it (NameHeld), but for root,
    whom the kernel lets replace it. One he makes between this look and the rename is replaced: he chose to race
    her write."""
    try:
        st = os.stat(out.name, dir_fd=parent.fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if perms.owned_by_me(st):
        return None
    if os.fstat(parent.fd).st_mode & stat.S_ISVTX and perms.own_uid() != 0:
        return None  # the kernel refuses the rename there, and dirfd.NameHeld says whose it is (exit 74, as before)
    who = perms.user_words(st.st_uid)
    return (f"{out} is already there and belongs to {who}: another user's file is never replaced (--force or "
            f"not); choose another name, or have {who} remove it")


FileTable = Mapping[str, Mapping]
"""{name: {"size": bytes, "sha256": hex digest}}: a checkpoint's manifest["files"], a corpus's meta["files"]."""


def file_entry_problems(files: dict, listed_in: str) -> list[str]:
    """A file table read from elsewhere (a checkpoint's manifest), entry by entry: a plain name in its directory
    (no "/", not "", "." or "..": a name from another user's table is never a path), its size and its sha256."""
    return [f"{listed_in}: bad entry for {name!r}" for name, entry in files.items()
            if not isinstance(name, str) or "/" in name or name in ("", ".", "..") or not isinstance(entry, dict)
            or not isinstance(entry.get("size"), int) or not isinstance(entry.get("sha256"), str)]


def table_problems(table: FileTable, size_of: Callable[[str], int | None],
                   sha256_of: Callable[[str], str] | None = None, listed_in: str = "the manifest",
                   label: Callable[[str], str] = str) -> list[str]:
    """Every way the files differ from `table` (empty: they match), each naming the file by label(name).

    size_of(name) gives a file's size, None when it is missing. Sizes come first, for all files: a truncated copy
    shows up without reading gigabytes. Only when every size matches, and sha256_of is given, is every sha256
    computed (sha256_of(name)). OSErrors of the callbacks propagate: the caller knows whether a read error means
    a damaged copy or a storage to retry later."""
    problems = []
    for name, entry in table.items():
        size = size_of(name)
        if size is None:
            problems.append(f"{label(name)}: missing (listed in {listed_in})")
        elif size != entry["size"]:
            problems.append(f"{label(name)}: size {size} bytes, {listed_in} says {entry['size']} "
                            "(truncated or changed)")
    if problems or sha256_of is None:
        return problems
    for name, entry in table.items():
        digest = sha256_of(name)
        if digest != entry["sha256"]:
            problems.append(f"{label(name)}: sha256 mismatch ({listed_in} says {entry['sha256'][:16]}..., "
                            f"file has {digest[:16]}...)")
    return problems


def local_size(path: str | os.PathLike) -> int | None:
    """A file's size, None when it does not exist (size_of for table_problems on a local directory; a link's own,
    never followed)."""
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return None


def not_regular(path: str | os.PathLike) -> str | None:
    """What a path that exists is when it is not a regular file (a link too: never followed), else None."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None  # missing or unreadable: table_problems says so as before
    return None if stat.S_ISREG(mode) else file_kind(mode)


def dir_table_problems(root: str | os.PathLike, table: FileTable, full_hash: bool = True,
                       listed_in: str = "the manifest") -> list[str]:
    """table_problems for the files of a local directory, each named by its path. A listed name that is not a
    regular file (a FIFO listed with size 0 would block the hash, a link to /dev/zero never end it; no link is
    followed, as PreparedCorpus follows none) is a problem before anything is read; each is hashed as
    untrusted.sha256_regular reads one (no link followed, never blocked, exactly its listed size), so one swapped
    for a link or a FIFO after that look is a problem too, not followed nor waited on."""
    root = Path(root)
    odd = [f"{root / name}: {kind}, not a regular file" for name in table if (kind := not_regular(root / name))]
    if odd:
        return odd
    try:
        return table_problems(table, lambda name: local_size(root / name),
                              (lambda name: sha256_regular(root / name, size=table[name]["size"]))
                              if full_hash else None, listed_in, label=lambda name: str(root / name))
    except Unreadable as e:
        if e.os_error is not None:
            raise e.os_error from None  # a read error (EIO): the caller's to judge, as before
        return [f"{e}, not a regular file of the listed size"]
