"""The trainer's torch.compile caches are the run's own: inductor's (TORCHINDUCTOR_CACHE_DIR) and triton's
(TRITON_CACHE_DIR) live under <scratch>/compile-cache/ (names.COMPILE_CACHE), kept across restarts so that a restart
reuses the kernels of the last one, unless the user set the variable for the supervisor to a directory of his own
alone (then it is kept, and that cache is not ours to touch). The rule, with TMPDIR beside them, and its one home:
minilmd/compile_cache.py (CACHE_DIRS and own_dirs are its).

A trainer killed while inductor compiles (a hang kill, an OOM kill) can leave a truncated kernel, a shared object cut
short, in the cache, and every later attempt then dies loading it until the run gives up. What the loader does with
one depends on where it was cut (measured with glibc on a kernel inductor built): under 64 bytes `file too short`,
its headers cut `cannot read file data`, a segment cut SIGBUS; zeros `invalid ELF header`. So a death is a damaged
kernel's when the tail of the attempt log, the trainer's last words, has the loader saying one of those of a file in
the run's own cache (an ImportError, inductor's InductorError), or when the trainer died of SIGBUS; then
`clear_damaged` removes that file and the kernels of the run's own cache that are damaged (`damaged_elf`: shorter than
the tables in their own header say). A SIGBUS with no damaged kernel there is left to the rest of the policy (the
staged corpus). Only regular files of ours inside the run's own cache dirs, reached without a symbolic link or `..`,
are ever removed; torch compiles them again. Torch-free.
"""
from __future__ import annotations

import os
import stat
import struct
from collections.abc import Mapping
from pathlib import Path

from minilmd.compile_cache import CACHE_DIRS, own_dirs  # noqa: F401 - CACHE_DIRS: scripts/gpu_check_train.py's
from minilmd.logread import tail_lines
from minilmd.openflags import OPEN_FLAGS
from minilmd.perms import owned_by_me
from minilmd.untrusted import Unreadable

DAMAGED_ELF = ("file too short", "cannot read file data", "invalid ELF header",
               "ELF load command address/offset not page-aligned",
               "ELF load command address/offset not properly aligned", "ELF file's phentsize not the expected size")
"""What the dynamic loader says of a shared object that is truncated or not one at all (glibc's messages)."""
TAIL_LINES = 200
TAIL_BYTES = 32 * 1024
"""How much of the end of an attempt log is searched: the traceback of the error that ended it."""
SCAN_LIMIT = 20_000
"""At most this many entries of the cache are looked at in one scan (a cache holds hundreds)."""
PHDRS_LIMIT = 64 * 1024
"""At most this many bytes of program headers are read from one file (a kernel has a dozen, 56 bytes each)."""


def loader_complaint(log_path: Path) -> tuple[str, str] | None:
    """(the line, the loader's words) of the last line of the log's tail in which the loader calls a shared object
    damaged; None if there is none."""
    try:
        lines = tail_lines(log_path, TAIL_LINES, max_bytes=TAIL_BYTES)[0]
    except Unreadable:  # a FIFO or a link put there: never opened
        return None
    for line in reversed(lines):
        for damage in DAMAGED_ELF:
            if f": {damage}" in line:
                return line, damage
    return None


def named_entry(line: str, damage: str, dirs: list[Path]) -> Path | None:
    """The file the loader's line names (`...: PATH: file too short`), when it is one of ours inside one of `dirs`
    (`_ours`), however the trainer spelled its path (a link above the cache resolved)."""
    before = line[:line.find(f": {damage}")]
    written = before[before.rfind(": ") + 2:] if ": " in before else before.strip()
    if not written.startswith(os.sep):
        return None
    real = os.path.realpath(written)
    for cache in dirs:
        inside = os.path.relpath(real, os.path.realpath(cache))
        if inside != os.curdir and not inside.startswith(os.pardir) and \
                (entry := _ours(cache, str(cache / inside))) is not None:
            return entry
    return None


def _ours(cache: Path, written: str) -> Path | None:
    """`written` as a regular file of this user below `cache`, every directory on the way a real one of this user
    (no link followed, no `..`); None otherwise."""
    try:
        parts = Path(written).relative_to(cache).parts
    except ValueError:
        return None
    if not parts or ".." in parts:
        return None
    chain = [cache] + [cache.joinpath(*parts[:i + 1]) for i in range(len(parts))]
    for i, path in enumerate(chain):
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode) or not owned_by_me(st):
            return None
        kind_ok = stat.S_ISREG if i == len(chain) - 1 else stat.S_ISDIR
        if not kind_ok(st.st_mode):
            return None
    return chain[-1]


def damaged_elf(path: Path) -> bool:
    """Whether a shared object is cut short or not one at all: under 64 bytes, no ELF magic, or shorter than the
    program header table, a loaded segment or the section header table its own header names (ld writes the
    section headers last, at the end of the file, so any cut loses them). Opened without following a link and
    without blocking; a file that cannot be read is not called damaged."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        head = os.pread(fd, 64, 0)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
            return True
        order = "<" if head[5] == 1 else ">"
        if head[4] == 2:  # ELF64
            phoff, shoff = struct.unpack_from(order + "QQ", head, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 0x36)
        else:  # ELF32
            phoff, shoff = struct.unpack_from(order + "II", head, 0x1C)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 0x2A)
        size = st.st_size
        if shoff + shentsize * shnum > size or phoff + phentsize * phnum > size:
            return True
        table = os.pread(fd, min(phentsize * phnum, PHDRS_LIMIT), phoff)
        for at in range(0, len(table) - phentsize + 1, phentsize or 1):
            if head[4] == 2:
                p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(order + "IIQQQQ", table, at)
            else:
                p_type, p_offset, _, _, p_filesz = struct.unpack_from(order + "IIIII", table, at)
            if p_type == 1 and p_offset + p_filesz > size:  # PT_LOAD: mapped, a SIGBUS where the file ends
                return True
        return False
    except (OSError, struct.error):
        return False
    finally:
        os.close(fd)


def damaged_kernels(dirs: list[Path]) -> list[Path]:
    """The shared objects of ours under `dirs` that `damaged_elf` calls damaged; links are not followed, at most
    SCAN_LIMIT entries are looked at."""
    found: list[Path] = []
    seen = 0
    for cache in dirs:
        if not cache.is_dir() or cache.is_symlink():
            continue
        for top, subdirs, files in os.walk(cache):  # os.walk does not descend into linked directories
            seen += len(subdirs) + len(files)
            if seen > SCAN_LIMIT:
                return found
            for name in files:
                path = Path(top) / name
                if name.endswith(".so") and _ours(cache, str(path)) is not None and damaged_elf(path):
                    found.append(path)
    return found


def clear_damaged(log_path: Path, root: Path, environ: Mapping[str, str], sigbus: bool, emit) -> bool:
    """After a crash whose log has the loader calling a kernel of the run's own cache damaged, or after a SIGBUS:
    remove the damaged kernels of the run's own cache (the named one too) and say so. Whether any was removed."""
    dirs = own_dirs(root, environ)
    complaint = None if sigbus else loader_complaint(log_path)
    if sigbus:
        entries = damaged_kernels(dirs)
    elif complaint is not None and (named := named_entry(*complaint, dirs)) is not None:
        entries = [named] + [p for p in damaged_kernels(dirs) if p != named]
    else:
        return False  # not the loader's words, or about a file that is not in the run's own cache
    removed = []
    for entry in entries:
        try:
            entry.unlink()
            removed.append(str(entry))
        except OSError as e:
            emit("compile_cache", f"could not remove the damaged kernel {entry}: {e}", path=str(entry))
    if not removed:
        return False
    why = f"the loader said '{complaint[1]}'" if complaint is not None else "SIGBUS"
    more = f" and {len(removed) - 3} more" if len(removed) > 3 else ""
    emit("compile_cache", f"the attempt died on a damaged kernel in the run's compile cache ({why}; a compile cut "
                          f"short by a kill): removed {', '.join(removed[:3])}{more}; retrying, not counted toward "
                          f"restart.no_progress_limit", paths=removed)
    return True
