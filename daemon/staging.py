"""Staging: copy a prepared corpus from slow shared storage (an NFS path or any fsspec URL) into fast scratch.

The user's first crash was a SIGBUS from a page fault on an mmap'ed corpus file that NFS could not fill; the cure
is to train from a copy in RAM (or on local disk). Rules:
- check first that the copy fits: free space of the scratch filesystem and, for a tmpfs, available memory with
  headroom left for training; refuse with the numbers and a local-disk alternative otherwise;
- copy each file to a temporary name, hashing while copying; retry a failed or short copy with backoff;
- the final name `<scratch>/corpus` only ever holds a copy whose sizes and sha256 matched `meta.json` and whose
  invariants `minilmd.corpus.verify_prepared` accepted (the whole directory is published by a rename at the end);
- an existing staged copy is reused only after verification; after a SIGBUS the supervisor calls
  `verify_staged()` and stages again, which copies only the damaged files.
Torch-free.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import psutil

from minilmd.corpus import FORMAT as CORPUS_FORMAT
from minilmd.corpus import verify_prepared
from minilmd.fsio import dir_table_problems, publish_dir, table_problems
from minilmd.names import CORPUS_META as META
from minilmd.names import STAGED_CORPUS, STAGING_OLD_PREFIX, STAGING_TMP_PREFIX

CHUNK = 8 * 1024 * 1024
GIB = 1024 ** 3
SPACE_MARGIN = 64 * 1024 * 1024
"""Kept free on the scratch filesystem beyond the corpus itself (checkpoints go there too)."""


class StagingError(RuntimeError):
    """Staging failed; the message says what, where and with which numbers. Worth retrying later."""


class SourceInvalid(StagingError):
    """The source is not a usable prepared corpus (no meta.json, wrong format, broken invariants): retrying will
    not help; this is a data error (final)."""


@dataclass
class StageProgress:
    file: str
    """The file being copied, relative to the corpus root."""
    done_bytes: int
    """Bytes copied so far over all files of this staging."""
    total_bytes: int
    """Bytes to copy in this staging (files reused from an earlier copy are not counted)."""
    rate_bytes_s: float
    """Average copy rate since the staging began."""

    def describe(self) -> str:
        pct = 100.0 * self.done_bytes / self.total_bytes if self.total_bytes else 100.0
        return (f"staging {self.file}: {_mb(self.done_bytes)} of {_mb(self.total_bytes)} ({pct:.0f}%) "
                f"at {_mb(self.rate_bytes_s)}/s")


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"



def _listed_files(meta: dict, where: str) -> dict[str, dict]:
    """meta["files"] checked for shape and for paths that stay inside the corpus directory."""
    if meta.get("format") != CORPUS_FORMAT:
        raise SourceInvalid(f"{where}: meta.json has format {meta.get('format')!r}, expected {CORPUS_FORMAT!r} "
                            f"(is this the output of `minilmd prepare`?)")
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        raise SourceInvalid(f"{where}: meta.json lists no files (key \"files\")")
    for rel, entry in files.items():
        p = PurePosixPath(rel)
        if p.is_absolute() or ".." in p.parts or rel == META:
            raise SourceInvalid(f"{where}: meta.json lists an unsafe file name {rel!r}")
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                and isinstance(entry.get("sha256"), str)):
            raise SourceInvalid(f"{where}: meta.json entry for {rel!r} needs an integer size and a sha256")
    return files


def verify_staged(path: str | os.PathLike, full_hash: bool = True) -> list[str]:
    """Problems of a staged corpus (empty list: good). Always: every file listed in its meta.json present with the
    listed size. full_hash: also every sha256 and the corpus invariants (`verify_prepared`); without it this is a
    quick check of sizes only (a truncated file, the SIGBUS story, shows up there)."""
    root = Path(path)
    try:
        meta = json.loads((root / META).read_text(encoding="utf-8"))
        files = _listed_files(meta, str(root))
    except FileNotFoundError:
        return [f"{root / META}: missing"]
    except (OSError, ValueError) as e:
        return [f"{root / META}: unreadable ({e})"]
    except SourceInvalid as e:
        return [str(e)]
    try:
        problems = dir_table_problems(root, files, full_hash=False, listed_in=META)
        if problems or not full_hash:
            return problems
        return verify_prepared(root)  # hashes every file itself
    except OSError as e:  # a read error (EIO from a failing disk or mount): damaged, not a crash
        return [f"{root}: unreadable ({e})"]


def _intact(path: Path, rel: str, entry: dict) -> bool:
    """A file of an earlier staged copy that can be kept: present, with the listed size and sha256."""
    try:
        return not dir_table_problems(path, {rel: entry}, listed_in=META)
    except OSError:
        return False


# --- will it fit? ---------------------------------------------------------------------------------------------------
def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _mount_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem type) of the filesystem holding `path`."""
    target = str(path.resolve())
    best = ("/", "")
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (target == mp or target.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best[0]):
            best = (mp, part.fstype)
    return best


def memory_headroom(total_memory: int) -> int:
    """Memory left free for training when staging into a tmpfs: max(2 GiB, 20 % of RAM)."""
    return max(2 * GIB, total_memory // 5)


def fit_problem(needed: int, scratch: str, mount: str, fstype: str, free_bytes: int,
                available_memory: int | None = None, headroom: int | None = None,
                alternative: str | None = None) -> str | None:
    """Why `needed` bytes do not fit in scratch (None: they fit). Pure arithmetic, so that it is testable.
    `available_memory` and `headroom` only count for a RAM disk (tmpfs, ramfs), whose pages are memory."""
    reasons = []
    if needed + SPACE_MARGIN > free_bytes:
        reasons.append(f"{mount} ({fstype or 'unknown fs'}) has {_mb(free_bytes)} free")
    if fstype in ("tmpfs", "ramfs") and available_memory is not None and headroom is not None:
        if available_memory - needed < headroom:
            reasons.append(f"{mount} is a RAM disk: {_mb(available_memory)} of memory is available and "
                           f"{_mb(headroom)} must stay free for training")
    if not reasons:
        return None
    hint = f"; set run.scratch to a local-disk directory, e.g. {alternative}" if alternative else \
        "; set run.scratch to a directory on a local disk with enough space"
    return f"the corpus needs {_mb(needed)} in {scratch}, but " + " and ".join(reasons) + hint


def _alternative_scratch(scratch: Path, needed: int) -> str | None:
    """A local-disk directory with room for the corpus, to name in the refusal."""
    for candidate in (Path("/var/tmp"), Path.home(), Path("/tmp")):
        try:
            if candidate.is_dir() and _mount_of(candidate)[1] not in ("tmpfs", "ramfs", "nfs", "nfs4"):
                st = os.statvfs(candidate)
                free = st.f_bavail * st.f_frsize
                if free > needed + SPACE_MARGIN:
                    return f"{candidate / 'minilmd' / scratch.name} ({_mb(free)} free)"
        except OSError:
            continue
    return None


def check_fit(needed: int, scratch_dir: Path, memory_headroom_bytes: int | None = None) -> None:
    """Raise StagingError with the numbers if `needed` bytes do not fit in scratch_dir. The memory headroom of a
    RAM disk defaults to max(2 GiB, 20 % of RAM)."""
    probe = _existing_ancestor(scratch_dir)
    st = os.statvfs(probe)
    mount, fstype = _mount_of(probe)
    vm = psutil.virtual_memory()
    headroom = memory_headroom(vm.total) if memory_headroom_bytes is None else memory_headroom_bytes
    free = st.f_bavail * st.f_frsize
    problem = fit_problem(needed, str(scratch_dir), mount, fstype, free, vm.available, headroom)
    if problem:
        problem = fit_problem(needed, str(scratch_dir), mount, fstype, free, vm.available, headroom,
                              _alternative_scratch(scratch_dir, needed))
        raise StagingError(problem)


# --- copying --------------------------------------------------------------------------------------------------------
def _open_source(source: str):
    import fsspec  # light, but only the supervisor needs it

    try:
        fs, root = fsspec.core.url_to_fs(source)
    except (ValueError, ImportError) as e:
        raise StagingError(f"cannot open corpus source {source!r}: {e}") from e
    return fs, root.rstrip("/")


def _read_meta(fs, root: str, source: str) -> tuple[bytes, dict]:
    try:
        raw = fs.cat_file(f"{root}/{META}")
    except FileNotFoundError:
        raise SourceInvalid(f"{source}: no meta.json (run `minilmd prepare` first)") from None
    except OSError as e:
        raise StagingError(f"{source}/{META}: cannot read ({e})") from e
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SourceInvalid(f"{source}/{META}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise SourceInvalid(f"{source}/{META}: not a JSON object")
    return raw, meta



class _Copier:
    """Copies listed files from the source with hashing, retries and progress accounting."""

    def __init__(self, fs, root: str, source: str, total: int, progress, retries: int, backoff_s: float, log):
        self.fs, self.root, self.source = fs, root, source
        self.total, self.done = total, 0
        self.progress, self.retries, self.backoff_s, self.log = progress, retries, backoff_s, log
        self.started = time.monotonic()

    def copy(self, rel: str, entry: dict, dest: Path) -> None:
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                wait = self.backoff_s * 2 ** (attempt - 1)
                self.log(f"staging: retrying {rel} in {wait:.1f}s (attempt {attempt + 1} of {self.retries + 1}): "
                         f"{last}")
                time.sleep(wait)
            done_before = self.done
            try:
                size, digest = self._copy_once(rel, dest)
            except OSError as e:
                last = f"{type(e).__name__}: {e}"
                self.done = done_before
                continue
            problems = table_problems({rel: entry}, {rel: size}.get, {rel: digest}.__getitem__, listed_in=META,
                                      label=lambda _: "copied")
            if not problems:
                return
            last = problems[0]
            self.done = done_before
        dest.unlink(missing_ok=True)
        raise StagingError(f"staging {self.source}/{rel} failed after {self.retries + 1} attempts: {last}")

    def _copy_once(self, rel: str, dest: Path) -> tuple[int, str]:
        h = hashlib.sha256()
        size = 0
        part = dest.with_name(dest.name + ".part")
        part.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.fs.open(f"{self.root}/{rel}", "rb") as src, open(part, "wb") as out:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    h.update(chunk)
                    size += len(chunk)
                    self.done += len(chunk)
                    if self.progress:
                        elapsed = max(time.monotonic() - self.started, 1e-9)
                        self.progress(StageProgress(rel, self.done, self.total, self.done / elapsed))
                out.flush()
                os.fsync(out.fileno())
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
        return size, h.hexdigest()


def stage(source: str, scratch_dir: str | os.PathLike, progress: Callable[[StageProgress], None] | None = None,
          *, retries: int = 3, backoff_s: float = 1.0, memory_headroom_bytes: int | None = None,
          log: Callable[[str], None] = lambda msg: None) -> Path:
    """Stage the prepared corpus at `source` (path or fsspec URL) into `<scratch_dir>/corpus` and return that path.

    Reuses a verified existing copy; otherwise copies what is missing or damaged (good files of a damaged copy are
    kept), verifies, and renames into place. Raises SourceInvalid (final) or StagingError (retry later)."""
    scratch = Path(scratch_dir)
    final = scratch / STAGED_CORPUS
    fs, root = _open_source(source)
    meta_raw, meta = _read_meta(fs, root, source)
    files = _listed_files(meta, source)

    scratch.mkdir(parents=True, exist_ok=True)
    for stale in list(scratch.glob(STAGING_TMP_PREFIX + "*")) + list(scratch.glob(STAGING_OLD_PREFIX + "*")):
        shutil.rmtree(stale, ignore_errors=True)  # one supervisor per run: anything here is from a dead one

    old = None
    if final.exists():
        same_source = (final / META).is_file() and (final / META).read_bytes() == meta_raw
        problems = verify_staged(final) if same_source else ["the source's meta.json changed since it was staged"]
        if not problems:
            log(f"staging: reusing verified copy at {final}")
            return final
        log(f"staging: existing copy at {final} is not usable: " + "; ".join(problems[:5]))
        old = scratch / f"{STAGING_OLD_PREFIX}{os.getpid()}"
        os.rename(final, old)

    tmp = scratch / f"{STAGING_TMP_PREFIX}{os.getpid()}"
    try:
        tmp.mkdir()
        to_copy = {}
        for rel, entry in files.items():
            if old is not None and (old / META).is_file() and _intact(old, rel, entry):
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                os.rename(old / rel, tmp / rel)  # verified good: no need to fetch it again
            else:
                to_copy[rel] = entry
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        needed = sum(e["size"] for e in to_copy.values())
        check_fit(needed, scratch, memory_headroom_bytes)
        if to_copy:
            log(f"staging: copying {len(to_copy)} file(s), {_mb(needed)}, from {source} to {scratch}")
        copier = _Copier(fs, root, source, needed, progress, retries, backoff_s, log)
        for rel, entry in to_copy.items():
            copier.copy(rel, entry, tmp / rel)
        (tmp / META).write_bytes(meta_raw)
        problems = verify_prepared(tmp)
        if problems:
            raise SourceInvalid(f"{source}: the copied corpus fails its checks: " + "; ".join(problems[:5]))
        publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    elapsed = time.monotonic() - copier.started
    log(f"staging: {final} ready ({_mb(needed)} copied in {elapsed:.1f}s)")
    return final
