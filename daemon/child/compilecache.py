"""The trainer's torch.compile caches are the run's own: inductor's (TORCHINDUCTOR_CACHE_DIR) and triton's
(TRITON_CACHE_DIR) live under <scratch>/compile-cache/ (names.COMPILE_CACHE), kept across restarts so that a restart
reuses the kernels of the last one, unless the user set the variable for the supervisor (then it is kept, and that
cache is not ours to touch).

A trainer killed while inductor compiles (a hang kill, an OOM kill) can leave a truncated kernel in the cache, and
every later attempt then dies loading it (`InductorError: ImportError: PATH.main.so: file too short`, or another
loader's word for a damaged ELF file) until the run gives up. `corrupt_entry` finds such a PATH in the tail of the
attempt log, the trainer's last words, and accepts it only as a regular file of ours inside one of the run's own
cache dirs, reached without a symbolic link and without `..`; `clear_corrupt_entry` removes that one file (torch
compiles it again) and says so. Nothing outside the run's own cache is ever deleted. Torch-free.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from minilmd.fsio import tail_lines

CACHE_DIRS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
"""Each cache variable and its directory under the run's compile cache."""
DAMAGED_ELF = ("file too short", "invalid ELF header", "ELF load command address/offset not page-aligned",
               "ELF load command address/offset not properly aligned", "ELF file's phentsize not the expected size")
"""What the dynamic loader says of a shared object that is truncated or not whole (glibc's messages)."""
TAIL_LINES = 200
TAIL_BYTES = 32 * 1024
"""How much of the end of an attempt log is searched: the traceback of the error that ended it."""


def trainer_env(root: Path, environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """{variable: (value, why)} for a trainer's environment: a variable set for the supervisor is kept; otherwise
    the run's own directory under `root` (<scratch>/compile-cache)."""
    env = {}
    for var, sub in CACHE_DIRS.items():
        if environ.get(var):
            env[var] = (environ[var], "set for the supervisor, kept")
        else:
            env[var] = (str(root / sub), "the run's own, under scratch")
    return env


def own_dirs(root: Path, environ: Mapping[str, str]) -> list[Path]:
    """The cache directories under `root` that this run's trainers use: those the user did not point elsewhere."""
    return [root / sub for var, sub in CACHE_DIRS.items() if not environ.get(var)]


def corrupt_entry(log_path: Path, root: Path, environ: Mapping[str, str]) -> Path | None:
    """The damaged kernel the attempt died on, when its log's tail names one inside the run's own cache; else None."""
    try:
        lines = tail_lines(log_path, TAIL_LINES, max_bytes=TAIL_BYTES)[0]
    except OSError:
        return None
    dirs = own_dirs(root, environ)
    for line in reversed(lines):
        for damage in DAMAGED_ELF:
            end = line.find(f": {damage}")
            if end < 0:
                continue
            for cache in dirs:
                start = line.find(f"{cache}{os.sep}")
                if 0 <= start < end and (entry := _ours(cache, line[start:end])) is not None:
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
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid():
            return None
        kind_ok = stat.S_ISREG if i == len(chain) - 1 else stat.S_ISDIR
        if not kind_ok(st.st_mode):
            return None
    return chain[-1]


def clear_corrupt_entry(log_path: Path, root: Path, environ: Mapping[str, str], emit) -> bool:
    """Remove the damaged kernel an attempt died on (`corrupt_entry`) and say so; whether one was removed."""
    entry = corrupt_entry(log_path, root, environ)
    if entry is None:
        return False
    try:
        entry.unlink()
    except OSError as e:
        emit("compile_cache", f"the attempt died on a damaged kernel in the run's compile cache, {entry}, which "
                              f"could not be removed: {e}", path=str(entry))
        return False
    emit("compile_cache", f"the attempt died on a damaged kernel in the run's compile cache (a compile cut short "
                          f"by a kill): removed {entry}; retrying, not counted toward restart.no_progress_limit",
         path=str(entry))
    return True
