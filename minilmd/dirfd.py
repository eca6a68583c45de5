"""One way to write into a place others can change: a directory opened once, checked, then used only through its
descriptor.

A name in a directory that another user can write means nothing a moment later: he can rename what stood there and
put his own directory, or a symbolic link to the owner's private file, in its place (issue 40: a chmod, an append and
a `--force` of `prepare` each did that to the victim). So everything minilmd creates in such a place goes through a
`Dir`:
- the place rule every shared place keeps (scratch, the GPU lock directory, an output's directory, a run.remote,
  run.dir) is minilmd/place_rule.py's, stated once in its docstring (`place_problem`, its opt-ins `group_share`,
  `team_above`, `team_root`, `owners`), and re-exported here for callers;
- `Dir.open` opens the directory once: walked from "/" by openat, no link followed but by the walk itself (root's or
  ours), each directory judged on its descriptor (place_rule.open_walked: the walk is the one judgement, so one
  swapped in, or a link planted, after any earlier look is refused);
  every later create, chmod, rename, exchange (renameat2) and delete is relative to its descriptor (`dir_fd=`,
  O_NOFOLLOW, O_EXCL), never by a path through its name;
- `Dir.make_temp` makes a temporary directory with a random name inside it, 0700, opened at once: a `Dir` of its
  own, reached by code that takes paths as `inside` (/proc/self/fd/N: the directory the descriptor holds);
- such a directory is renamed into place by minilmd/dirpublish.py's `publish`, identities checked on both sides;
- `Dir.remove_tree` removes a directory only when it is the one expected, its contents through descriptors, a tree
  at most MAX_TREE_DEPTH deep (minilmd/dirtree.py); `Dir.write_atomic` writes a file (O_EXCL, fsync, rename) there,
  `Dir.replacing` one written bit by bit; `Dir.make_dir`, `Dir.open_new`, `Dir.open_or_make` and `Dir.remove_dir`
  make or remove one name (O_EXCL, no link followed) for a walk below a root (daemon/jobs/remote_write.py
  parent_dir) or a lock file (minilmd/corpus/prepare/lock.py).

tests/test_shared_write_audit.py fails on a by-path create, rename, chmod or delete outside this module that is not
in its allowlist of reviewed sites. Torch-free.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import secrets
import stat
from collections.abc import Iterator, Set
from pathlib import Path
from typing import IO

from minilmd.dirtree import OPEN_DIR, TooDeep, empty_tree
from minilmd.openflags import NO_FOLLOW_NO_BLOCK
from minilmd.perms import own_link, owned_by_me, user_words
from minilmd.place_rule import (  # noqa: F401 - for callers
    PlaceRefused,
    open_walked,
    place_problem,
    run_dir_problem,
)
from minilmd.tmpnames import atomic_tmp_prefix

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # <linux/fs.h>
AT_FDCWD = -100
_FLAGS_NOT_DONE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}
"""What renameat2 says where the kernel or the file system does not do its flags (NFS: EINVAL)."""
OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
PRIVATE = 0o700
Identity = tuple[int, int]
"""(device, inode): what a directory is, not what its name leads to."""


class Replaced(ValueError):
    """A name did not lead to the directory expected (someone moved another one there): nothing was replaced."""


class NameHeld(PermissionError):
    """A rename onto a name another user holds in a sticky directory (/tmp, a 1777 share): only that user (or root)
    may replace it, so the kernel says EPERM, and a message of "Operation not permitted" naming the temporary file
    told the user nothing. `strerror` says whose the name is, `what_to_do` what to do."""

    def __init__(self, path: Path, owner: int):
        super().__init__(errno.EPERM, f"{path.name} there belongs to {user_words(owner)}, and the directory is "
                                      f"sticky: only its owner may replace it", str(path))
        self.owner = owner
        self.what_to_do = f"choose another name, or have {user_words(owner)} remove it"


def _renamed(src_fd: int, src: str, dst_fd: int, dst: str, dst_path: Path) -> None:
    """rename(2) of `src` at src_fd onto `dst` at dst_fd (no link followed); NameHeld when refused because another
    user holds `dst` in a sticky directory, any other OSError as it comes."""
    try:
        os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
    except PermissionError as e:
        try:
            held = os.stat(dst, dir_fd=dst_fd, follow_symlinks=False)
            sticky = os.fstat(dst_fd).st_mode & stat.S_ISVTX
        except OSError:
            raise e from None
        if sticky and not owned_by_me(held):
            raise NameHeld(dst_path, held.st_uid) from None
        raise


# --- renameat2 -----------------------------------------------------------------------------------------------------

@functools.cache
def _libc_renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc 2.28 and later, musl 1.2.2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def renameat2(src_fd: int, src: str | os.PathLike, dst_fd: int, dst: str | os.PathLike, flags: int) -> bool:
    """Linux's renameat2(2): True when done; False when this kernel, libc or file system does not do `flags`
    (EINVAL from NFS, ENOSYS, no renameat2 at all): the caller's fallback then. Any other failure raises as
    os.rename's does (FileExistsError for RENAME_NOREPLACE onto a name taken)."""
    fn = _libc_renameat2()
    if fn is None:
        return False
    if fn(src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), flags) == 0:
        return True
    if (err := ctypes.get_errno()) in _FLAGS_NOT_DONE:
        return False
    raise OSError(err, os.strerror(err), os.fspath(src), None, os.fspath(dst))


def temp_name(prefix: str, salt: str | None = None) -> str:
    """`<prefix>.<8 random hex digits>`: the name Dir.make_temp gives (`salt`: those digits, for the longest)."""
    return f"{prefix}.{secrets.token_hex(4) if salt is None else salt}"


# --- a directory used through its descriptor -------------------------------------------------------------------------

class Dir:
    """A directory opened once; `path` only names it in messages. Close it (or use `with`)."""

    owners: Set[int] = frozenset()  # uids besides ours a directory we make shows (root_squash: perms.LearntOwners)

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path
        st = os.fstat(fd)
        self.identity: Identity = (st.st_dev, st.st_ino)

    @classmethod
    def open(cls, path: str | os.PathLike, label: str, *, group_share: bool = False,
             team_above: bool = False, team_root: bool = False, owners: Set[int] = frozenset()) -> Dir:
        """The directory at path (a link on the way followed only when root's or ours), refused (PlaceRefused)
        unless it and every directory above it pass place_problem's rule; `group_share` waives the rule for this
        one directory (a team directory, by the owner's choice), `team_root` all of it but its owner (a team-shared
        run.remote: root's, ours or `owners'`), `team_above` lets the directories above it be group-writable
        (place_problem); `owners`: place_problem's. Judged once, by the walk that opens it (open_walked): a
        judgement by path first (abspath) read `a/link/../b` as `a/b`, where the walk, as the kernel, goes up from
        where the link leads, and refused a directory the walk would open."""
        path = Path(path)
        what, advice = f"what minilmd makes in {path}", "choose a directory only you (and root) can change"
        return cls(open_walked(path, label, what, advice, group_share=group_share, team_above=team_above,
                               team_root=team_root, owners=owners), path)

    @classmethod
    def at(cls, parent: Dir, name: str, *, own_links: bool = False) -> Dir:
        """The directory `name` in parent, no link followed (OSError ELOOP/ENOTDIR for a link or a file);
        `own_links`: a link there followed when it is root's or ours, Dir.open's rule (a corpus --out of the user's)."""
        link = own_links and own_link(os.stat(name, dir_fd=parent.fd, follow_symlinks=False))
        flags = OPEN_DIR & ~os.O_NOFOLLOW if link else OPEN_DIR
        return cls(os.open(name, flags, dir_fd=parent.fd), parent.path / name)

    @property
    def inside(self) -> Path:
        """A path through the descriptor, for code that takes paths. Only for a directory no one else can write
        (a make_temp directory, or one checked so): the names inside it are then ours alone."""
        return Path(f"/proc/self/fd/{self.fd}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- looking ---

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def identity_of(self, name: str) -> Identity | None:
        st = self.lstat(name)
        return None if st is None or stat.S_ISLNK(st.st_mode) else (st.st_dev, st.st_ino)

    # --- creating ---

    def make_temp(self, prefix: str) -> tuple[Dir, str]:
        """A new directory `<prefix>.<8 random characters>` in this one, 0700, opened: (it, its name)."""
        for _ in range(100):
            name = temp_name(prefix)
            try:
                os.mkdir(name, PRIVATE, dir_fd=self.fd)
            except FileExistsError:
                continue
            made = Dir.at(self, name)
            st = os.fstat(made.fd)
            if not owned_by_me(st) or stat.S_IMODE(st.st_mode) & 0o077:  # swapped between the mkdir and the open
                made.close()
                raise Replaced(f"{self.path / name}: the temporary directory just made is not this process's "
                               f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); someone replaced it")
            return made, name
        raise FileExistsError(errno.EEXIST, "no free temporary name", str(self.path / prefix))

    def create_new(self, prefix: str, suffix: str, mode: int = 0o600) -> tuple[int, str]:
        """A new regular file `<prefix><8 random characters><suffix>`, O_EXCL: (its write descriptor, its name)."""
        for _ in range(100):
            name = f"{prefix}{secrets.token_hex(4)}{suffix}"
            try:
                return os.open(name, OPEN_NEW, mode, dir_fd=self.fd), name
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, "no free name", str(self.path / prefix))

    def make_dir(self, name: str, mode: int = 0o777) -> None:
        """A new directory `name` here (mkdirat, `mode` less the umask): FileExistsError when anything is there."""
        os.mkdir(name, mode, dir_fd=self.fd)

    def open_new(self, name: str, mode: int = 0o666) -> int:
        """A new regular file `name` here opened for writing (O_EXCL, no link followed: FileExistsError when anything
        is there, a link too): its descriptor, for the caller to close."""
        return os.open(name, OPEN_NEW, mode, dir_fd=self.fd)

    def open_or_make(self, name: str, flags: int, mode: int) -> tuple[int, bool]:
        """The file `name` here opened with `flags` (which carry O_NOFOLLOW: no link followed), made new (O_EXCL,
        `mode`) when missing: (its descriptor, whether it was made here). FileNotFoundError when it went between
        the two opens. The caller checks what it got (fstat) and closes it."""
        try:
            return os.open(name, flags | os.O_CREAT | os.O_EXCL, mode, dir_fd=self.fd), True
        except FileExistsError:
            return os.open(name, flags, dir_fd=self.fd), False

    def write_atomic(self, name: str, data: bytes, mode: int, tag: str = "") -> None:
        """`name` replaced whole by `data`, mode `mode`: `.<name>.<tag>XXXXXXXX.tmp` O_EXCL, fsync, rename, here."""
        with self.replacing(name, mode, tag) as f:
            f.write(data)

    @contextlib.contextmanager
    def replacing(self, name: str, mode: int, tag: str = "", *, text: bool = False) -> Iterator[IO]:
        """write_atomic for a file written bit by bit (a corpus of many MB): the block writes into the file object
        given (binary, or UTF-8 text with `text`), which is renamed over `name` once the block ends; removed when
        the block raises, `name` as it was."""
        fd, tmp = self.create_new(atomic_tmp_prefix(name) + tag, ".tmp", 0o600)
        try:
            with os.fdopen(fd, "w" if text else "wb", encoding="utf-8" if text else None) as f:
                os.fchmod(f.fileno(), mode)
                yield f
                f.flush()
                os.fsync(f.fileno())
            _renamed(self.fd, tmp, self.fd, name, self.path / name)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except FileNotFoundError:
                pass
            raise

    def mode_file(self, name: str, mode: int) -> None:
        """chmod a regular file of ours in this directory, through a descriptor opened without following a link
        (open_own: a link or another user's file there raises PermissionError, nothing changed)."""
        fd = self.open_own(name)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def open_own(self, name: str, flags: int = os.O_RDONLY) -> int:
        """A descriptor of the regular file `name` of this user's in this directory, opened without following a
        link or blocking (`flags`: os.O_RDWR to write it); a link (ELOOP), anything but a regular file or another
        user's file raises PermissionError, nothing opened. The caller closes it."""
        try:
            fd = os.open(name, flags | NO_FOLLOW_NO_BLOCK, dir_fd=self.fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise PermissionError(errno.EPERM, "a symbolic link or not a regular file",
                                      str(self.path / name)) from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not owned_by_me(st):
            os.close(fd)
            raise PermissionError(errno.EPERM, "not a regular file of this user's", str(self.path / name))
        return fd

    def mode_self(self, mode: int) -> None:
        os.fchmod(self.fd, mode)

    # --- renaming ---

    def rename(self, name: str, to: Dir, to_name: str) -> None:
        """rename(2) of `name` here to `to_name` in `to` (replaces a file there, as rename does; no link followed;
        NameHeld when another user holds `to_name` in a sticky directory)."""
        _renamed(self.fd, name, to.fd, to_name, to.path / to_name)

    def rename_new(self, name: str, to_name: str) -> bool:
        """`name` renamed to `to_name` unless something stands there (False, nothing changed). RENAME_NOREPLACE;
        without it (NFS) see _rename_claimed: never over anything that stands there, an empty directory too."""
        try:
            if not renameat2(self.fd, name, self.fd, to_name, RENAME_NOREPLACE):
                return self._rename_claimed(name, to_name)
        except (FileExistsError, NotADirectoryError):
            return False
        except OSError as e:
            if e.errno == errno.ENOTEMPTY:
                return False
            raise
        return True

    def _rename_claimed(self, name: str, to_name: str) -> bool:
        """rename_new without RENAME_NOREPLACE. A plain rename(2) replaces an empty directory at to_name (maybe a
        teammate's): so to_name is claimed first by an empty directory of ours (mkdir fails when anything stands
        there), and the rename replaces only that claim. A file is linked to its new name, then unlinked."""
        st = self.lstat(name)
        if st is None:
            raise FileNotFoundError(errno.ENOENT, "gone", str(self.path / name))
        if not stat.S_ISDIR(st.st_mode):
            os.link(name, to_name, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
            os.unlink(name, dir_fd=self.fd)
            return True
        os.mkdir(to_name, PRIVATE, dir_fd=self.fd)  # FileExistsError: taken
        claim = self.lstat(to_name)
        if claim is None or not stat.S_ISDIR(claim.st_mode) or not owned_by_me(claim, also=self.owners):
            return False  # taken from us at once: whatever stands there now is not ours to replace
        claimed = (claim.st_dev, claim.st_ino)
        try:
            os.rename(name, to_name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            if self.identity_of(to_name) == claimed:
                os.rmdir(to_name, dir_fd=self.fd)
            raise
        return True

    def exchange(self, a: str, b: str) -> bool:
        """Swap the entries a and b in one step (both must exist): False where the file system cannot (NFS)."""
        return renameat2(self.fd, a, self.fd, b, RENAME_EXCHANGE)

    # --- removing ---

    def remove_file(self, name: str, expected: Identity | None = None) -> bool:
        """Unlink `name` here; with `expected`, only while it is that file (looked at again just before: one put in
        its place meanwhile is left, False). Between that look and the unlink only who can write this directory
        could swap it: in a directory Dir.open's rule passed, this user alone. False too when it was not there."""
        if expected is not None and self.identity_of(name) != expected:
            return False
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True

    def remove_tree(self, name: str, expected: Identity) -> bool:
        """Remove the directory `name` only when it is `expected`: its contents through descriptors, then its name
        (rmdir: a directory swapped in meanwhile is removed only when empty). False when it was not `expected`."""
        try:
            sub = Dir.at(self, name)
        except (FileNotFoundError, NotADirectoryError, OSError):
            return False
        with sub:
            if sub.identity != expected:
                return False
            try:
                sub.empty()
            except TooDeep:
                return False  # a tree minilmd did not make: what is below the limit is left
        try:
            os.rmdir(name, dir_fd=self.fd)
        except OSError:
            return False
        return True

    def remove_dir(self, name: str) -> None:
        """rmdir(2) of `name` here: only an empty directory goes (OSError otherwise)."""
        os.rmdir(name, dir_fd=self.fd)

    def empty(self) -> None:
        """Everything inside this directory removed through descriptors (no link followed: a link is unlinked)."""
        empty_tree(self.fd)

    def discard(self, tmp: Dir, tmp_name: str) -> None:
        """A make_temp directory that was not published: emptied through its own descriptor, its name removed only
        while it still leads to it."""
        if tmp.fd < 0:
            return
        try:
            tmp.empty()
        except OSError:
            pass
        if self.identity_of(tmp_name) == tmp.identity:
            try:
                os.rmdir(tmp_name, dir_fd=self.fd)
            except OSError:
                pass
        tmp.close()
