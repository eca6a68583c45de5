"""Staging: copy a prepared corpus from slow shared storage (an NFS path or any fsspec URL) into fast scratch.

The user's first crash was a SIGBUS from a page fault on an mmap'ed corpus file that NFS could not fill; the cure
is to train from a copy in RAM (or on local disk). Rules:
- check first that the copy fits (daemon/jobs/scratch_room.py): free space of the scratch filesystem and, for a
  tmpfs, available memory with headroom left for training; otherwise the whole arithmetic and a local-disk
  alternative: ScratchFull (waited for) when scratch is big enough and others hold the space, ScratchTooSmall
  (final) when it never fits. Before that, `run_space_problem()` (for `minilmd run --check` and the launch)
  checks that the corpus, the staged probe val split and init.from copy AND the checkpoints kept between two
  syncs fit;
- copy each file to a temporary name, hashing while copying; retry a failed or short copy with backoff;
- a source that cannot be read (its meta.json, or a file after the retries: EIO, ESTALE, the share gone, an empty
  directory: a mount point whose share is not mounted) raises SourceUnreachable, waited for by the supervisor,
  unless a verified staged copy of that same source (its record, `<scratch>/corpus.source`) is there to train
  from; a source that is read and wrong (a directory of other files
  without meta.json, a file that stays short) is SourceInvalid or StagingError;
- the final name `<scratch>/corpus` only ever holds a copy whose sizes and sha256 matched `meta.json` and whose
  invariants `minilmd.corpus.format.verify_prepared` accepted (the whole directory is published by a rename at the end);
- an existing staged copy is reused only after verification; after a SIGBUS the supervisor calls
  `verify_staged()` and stages again, which copies only the damaged files;
- nothing is removed in scratch unless it is still the directory the run claimed (minilmd/scratch.py
  `ensure_held`, asked right before each removal; the supervisor claims it again before each staging).
Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from minilmd import scratch as scratchmod
from minilmd.backoff import STAGING_COPY_FIRST_S, STAGING_COPY_MAX_S, STAGING_COPY_RETRIES, exponential
from minilmd.corpus_meta import CorpusError, listed_files, owner_note, parse_meta
from minilmd.daemon.jobs.scratch_room import check_fit, check_inodes
from minilmd.daemon.jobs.staging_errors import ScratchFull, SourceInvalid, SourceUnreachable, StagingError
from minilmd.fmt import fmt_mb as _mb
from minilmd.fsio import dir_table_problems, is_disk_full, publish_dir, table_problems
from minilmd.names import COPY_CHUNK_BYTES as CHUNK
from minilmd.names import CORPUS_META as META
from minilmd.names import (
    CORPUS_META_MAX_BYTES,
    LOSS_MASK,
    STAGED_CORPUS,
    STAGING_OLD_PREFIX,
    STAGING_TMP_PREFIX,
    TOKENS,
)
from minilmd.perms import who_else_writes
from minilmd.shared_place import Place, look, record_staged_from, same_source, staged_from
from minilmd.tmpnames import part_name
from minilmd.untrusted import Unreadable, loads_any, open_regular, read_bytes, read_stream
from minilmd.urls import is_local_fs, open_fs


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


def _listed_files(meta: dict, where: str) -> dict[str, dict]:
    """meta["files"], checked by the prepared-corpus format (minilmd/corpus_meta.py); SourceInvalid if bad."""
    try:
        return listed_files(meta, where)
    except CorpusError as e:
        raise SourceInvalid(str(e)) from None


def verify_staged(path: str | os.PathLike, full_hash: bool = True) -> list[str]:
    """Problems of a staged corpus (empty list: good). Always: every file listed in its meta.json present with the
    listed size. full_hash: also every sha256 and the corpus invariants (`verify_prepared`); without it this is a
    quick check of sizes only (a truncated file, the SIGBUS story, shows up there)."""
    root = Path(path)
    try:
        meta = loads_any(read_bytes(root / META, max_bytes=CORPUS_META_MAX_BYTES))  # never a FIFO, never too deep
        files = _listed_files(meta if isinstance(meta, dict) else {}, str(root))
    except Unreadable as e:
        return [f"{root / META}: " + ("missing" if e.missing else f"unreadable ({e.os_error or e.why})")]
    except (OSError, ValueError) as e:
        return [f"{root / META}: unreadable ({e})"]
    except SourceInvalid as e:
        return [str(e)]
    try:
        problems = dir_table_problems(root, files, full_hash=False, listed_in=META)
        if problems or not full_hash:
            return problems
        from minilmd.corpus.format import verify_prepared

        return verify_prepared(root)  # hashes every file itself
    except OSError as e:  # a read error (EIO from a failing disk or mount): damaged, not a crash
        return [f"{root}: unreadable ({e})"]


def _intact(path: Path, rel: str, entry: dict) -> bool:
    """A file of an earlier staged copy that can be kept: present, with the listed size and sha256."""
    try:
        return not dir_table_problems(path, {rel: entry}, listed_in=META)
    except OSError:
        return False


APPENDABLE = (TOKENS, LOSS_MASK)
"""The split files `prepare --append` grows in place (minilmd/corpus/prepare/append.py): an earlier version's copy of
one is the prefix of the new one."""


def _earlier_files(old: Path, meta: dict) -> dict[str, dict]:
    """The appendable files of the staged copy at `old` when its meta.json is an earlier version of `meta` (the
    new meta's `versions` chain names its sha256), else {}."""
    try:
        raw = read_bytes(old / META, max_bytes=CORPUS_META_MAX_BYTES)
        old_meta = loads_any(raw)
    except (OSError, ValueError):
        return {}
    digest = hashlib.sha256(raw).hexdigest()
    chain = {v.get("previous_meta_sha256") for v in meta.get("versions", []) if isinstance(v, dict)}
    if digest not in chain or not isinstance(old_meta, dict) or not isinstance(old_meta.get("files"), dict):
        return {}
    return {rel: e for rel, e in old_meta["files"].items()
            if PurePosixPath(rel).name in APPENDABLE and isinstance(e, dict) and isinstance(e.get("size"), int)}


# --- copying --------------------------------------------------------------------------------------------------------
def _open_source(source: str):
    try:
        opened = open_fs(source)
    except (ValueError, ImportError) as e:
        raise StagingError(f"cannot open corpus source {source!r}: {e}") from e
    return opened.fs, opened.root


def _read_meta(fs, root: str, source: str) -> tuple[bytes, dict]:
    """The source's meta.json, raw and parsed. Missing: see `_meta_missing`; an I/O error: SourceUnreachable."""
    try:  # a local source's meta.json as untrusted (minilmd/untrusted.py): never a FIFO or /dev/zero read whole
        path = f"{root}/{META}"
        raw = read_bytes(path, max_bytes=CORPUS_META_MAX_BYTES) if is_local_fs(fs) else _read_url_meta(fs, path)
    except Unreadable as e:  # as cat_file's errors below, but a FIFO, a link, a directory, too big: final
        if e.missing or isinstance(e.os_error, NotADirectoryError):  # a file where the corpus's directory belongs
            raise _meta_missing(fs, root, source) from None
        if e.os_error is not None:
            raise SourceUnreachable(f"{source}/{META}: cannot be read ({e.os_error})") from e.os_error
        raise SourceInvalid(f"{source}/{META}: {e.why}") from None
    except FileNotFoundError:
        raise _meta_missing(fs, root, source) from None
    except OSError as e:
        raise SourceUnreachable(f"{source}/{META}: cannot be read ({e})") from e
    try:
        return raw, parse_meta(raw, f"{source}/{META}")
    except CorpusError as e:
        raise SourceInvalid(str(e)) from None


def _read_url_meta(fs, path: str) -> bytes:
    """A URL source's meta.json, bounded as a local one is: at most CORPUS_META_MAX_BYTES + 1 bytes read (a hostile
    or broken server's endless body is never held whole in memory), more refused (Unreadable, too_big)."""
    with fs.open(path, "rb") as f:
        return read_stream(f, path, max_bytes=CORPUS_META_MAX_BYTES, what=f"the most a corpus's {META} may be")


def _meta_missing(fs, root: str, source: str) -> StagingError:
    """What a source without meta.json is (minilmd/shared_place.py decides, as for the probe, the LoRA base's copy
    and the config check). Its share gone, an empty directory (a mount point whose share is not mounted), or one
    that cannot be listed: SourceUnreachable, waited for. Not a directory, or one holding other files: SourceInvalid,
    not a prepared corpus (final)."""
    found = look(root, META, fs)
    if found.outage:
        return SourceUnreachable(f"{source}: {found}")
    if found.place is Place.NOT_A_DIRECTORY:
        return SourceInvalid(f"{source}: {found}")
    if found.place is Place.THERE:  # missing when read, there when looked at: being written; the retry reads it
        return SourceUnreachable(f"{source}/{META}: missing when read, there just after (written meanwhile?)")
    return SourceInvalid(f"{source}: no meta.json (run `minilmd prepare` first)")


class _SourceReadError(OSError):
    """An OSError met reading the source (not writing scratch): the copy's retries, then SourceUnreachable."""


class _Copier:
    """Copies listed files from the source with hashing, retries and progress accounting."""

    def __init__(self, fs, root: str, source: str, total: int, progress, retries: int, backoff_s: float, log):
        self.fs, self.root, self.source = fs, root, source
        self.total, self.done = total, 0
        self.progress, self.retries, self.backoff_s, self.log = progress, retries, backoff_s, log
        self.started = time.monotonic()

    def copy(self, rel: str, entry: dict, dest: Path, keep: int = 0) -> None:
        """Copy `rel` to `dest`; keep > 0: dest already holds the file's first `keep` bytes (a staged copy of an
        earlier version of an appended corpus, verified): only the rest is fetched."""
        last, error = "", None
        for attempt in range(self.retries + 1):
            if attempt:
                wait = exponential(self.backoff_s, attempt, cap_s=STAGING_COPY_MAX_S)
                self.log(f"staging: retrying {rel} in {wait:.1f}s (attempt {attempt + 1} of {self.retries + 1}): "
                         f"{last}")
                time.sleep(wait)
            done_before = self.done
            try:
                size, digest = self._copy_once(rel, dest, entry["size"], keep)
            except OSError as e:
                cause = e.__cause__ if isinstance(e, _SourceReadError) and e.__cause__ else e
                last, error = f"{type(cause).__name__}: {e}", e
                self.done = done_before
                continue
            error = None
            problems = table_problems({rel: entry}, {rel: size}.get, {rel: digest}.__getitem__, listed_in=META,
                                      label=lambda _: "copied")
            if not problems:
                return
            last = problems[0]
            self.done = done_before
        dest.unlink(missing_ok=True)
        message = f"staging {self.source}/{rel} failed after {self.retries + 1} attempts: {last}"
        if error is None:  # a size or sha256 that does not match: say who else could have changed the file
            message += self._others_note(rel)
        if isinstance(error, _SourceReadError):
            raise SourceUnreachable(message)
        if error is not None and is_disk_full(error):  # another job filled scratch
            raise ScratchFull(message)
        raise StagingError(message)

    def _others_note(self, rel: str) -> str:
        """"; SOURCE/rel is writable by its group team (gid N), mode 664: another user may have changed it" (perms.
        who_else_writes), for a local source file another user owns or can write; "" otherwise."""
        if not is_local_fs(self.fs):
            return ""
        path = f"{self.root}/{rel}"
        try:
            who = who_else_writes(os.lstat(path), path)
        except OSError:
            return ""
        return f"; {self.source}/{rel} is {who}: another user may have changed it" if who else ""

    def _copy_once(self, rel: str, dest: Path, listed: int, keep: int = 0) -> tuple[int, str]:
        """Copy the first `listed` bytes of the source file (it may be longer: an append writes its tail before
        its meta.json); with keep, after dest's first `keep` bytes, which are hashed, not fetched. Its own loop, not
        untrusted.copy_regular's: the source may be a remote's fsspec file (copy_regular opens a local path), the
        copy resumes after `keep`, and each read's OSError is told from scratch's writes (_source_reads)."""
        h = hashlib.sha256()
        size = 0
        part = dest.with_name(part_name(dest.name))
        part.parent.mkdir(parents=True, exist_ok=True)
        if keep:
            with open(dest, "rb") as f:
                while size < keep and (chunk := f.read(min(CHUNK, keep - size))):
                    h.update(chunk)
                    size += len(chunk)
            part.unlink(missing_ok=True)
            os.link(dest, part)  # the same file: a failed attempt leaves dest's prefix (the next cuts it back)
        try:
            with _source_reads(rel):
                src = self._open_source(rel)
            with src, open(part, "r+b" if keep else "wb") as out:
                if keep:
                    with _source_reads(rel):
                        src.seek(keep)
                    out.truncate(keep)
                    out.seek(keep)
                while size < listed:
                    with _source_reads(rel):
                        chunk = src.read(min(CHUNK, listed - size))
                    if not chunk:
                        break
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

    def _open_source(self, rel: str):
        """The source file, open for reading. On a local fs as untrusted (minilmd/untrusted.py open_regular: the
        share is another user's or another run's): a link is not followed and a FIFO never opened, so the copy
        never blocks; either is final (SourceInvalid). Missing, an I/O error, or replaced while opened: the
        OSError the copy's retries take (then SourceUnreachable)."""
        path = f"{self.root}/{rel}"
        if not is_local_fs(self.fs):
            return self.fs.open(path, "rb")
        try:
            return os.fdopen(open_regular(path), "rb")
        except Unreadable as e:
            if e.missing:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path) from None
            if e.os_error is not None:
                raise e.os_error from None
            if e.why == "replaced while being opened":
                raise OSError(errno.ESTALE, e.why, path) from None
            raise SourceInvalid(f"{self.source}/{rel}: {e.why}, not a regular file") from None


@contextlib.contextmanager
def _source_reads(rel: str):
    """OSErrors of the source's open, seek and reads as _SourceReadError, told apart from scratch's writes."""
    try:
        yield
    except OSError as e:
        raise _SourceReadError(e.errno, f"reading {rel}: {e.strerror or e}") from e


def stage(source: str, scratch_dir: str | os.PathLike, progress: Callable[[StageProgress], None] | None = None,
          *, retries: int = STAGING_COPY_RETRIES, backoff_s: float = STAGING_COPY_FIRST_S,
          memory_headroom_bytes: int | None = None,
          log: Callable[[str], None] = lambda msg: None, from_copy: Callable[[str], None] = lambda why: None) -> Path:
    """Stage the prepared corpus at `source` (path or fsspec URL) into `<scratch_dir>/corpus` and return that path.

    Reuses a verified existing copy; otherwise copies what is missing or damaged (good files of a damaged copy are
    kept), verifies, and renames into place. Raises SourceInvalid (final) or StagingError (retry later). A source
    that cannot be read with a verified copy in scratch: that copy is returned, and `from_copy` told why."""
    scratch = Path(scratch_dir)
    final = scratch / STAGED_CORPUS
    fs, root = _open_source(source)
    try:
        meta_raw, meta = _read_meta(fs, root, source)
    except SourceUnreachable as e:
        if not (final.is_dir() and not os.path.islink(final)):
            raise
        scratchmod.ensure_held(scratch)  # this run's scratch still, before anything in it is trusted
        copied = staged_from(scratch)
        if copied is not None and not same_source(copied, source):  # another data.prepared's: never trained from
            raise SourceUnreachable(f"{e}; the copy in scratch is not of this source") from None
        # no record (a copy staged before the record existed): trained from as before, once verified
        if verify_staged(final):
            raise
        log(f"staging: the corpus source cannot be read ({e}): training from its verified copy at {final}")
        from_copy(str(e))
        return final
    files = _listed_files(meta, source)
    if owner := owner_note(source, meta):  # another user's corpus: said in the launch's log, never refused
        log(f"staging: note: {owner}")

    scratch.mkdir(parents=True, exist_ok=True)
    scratchmod.ensure_held(scratch)  # the scratch claimed (owner, no link, nobody else can swap it), and still it
    for stale in list(scratch.glob(STAGING_TMP_PREFIX + "*")) + list(scratch.glob(STAGING_OLD_PREFIX + "*")):
        shutil.rmtree(stale, ignore_errors=True)  # one supervisor per run: anything here is from a dead one

    old = None
    if final.exists():
        unchanged = (final / META).is_file() and (final / META).read_bytes() == meta_raw
        problems = verify_staged(final) if unchanged else ["the source's meta.json changed since it was staged"]
        if not problems:
            log(f"staging: reusing verified copy at {final}")
            record_staged_from(scratch, source)
            return final
        log(f"staging: existing copy at {final} is not usable: " + "; ".join(problems[:5]))
        scratchmod.ensure_held(scratch)  # again right before the removal: it must be this run's scratch still
        if os.path.islink(final) or not final.is_dir():
            raise StagingError(f"{final} is not a directory: staging replaces only a copy it made; remove it")
        old = scratch / f"{STAGING_OLD_PREFIX}{os.getpid()}"
        os.rename(final, old)

    tmp = scratch / f"{STAGING_TMP_PREFIX}{os.getpid()}"
    try:
        tmp.mkdir()
        to_copy = {}
        kept: dict[str, int] = {}  # rel -> bytes of an earlier version's copy, kept: only its tail is fetched
        earlier = _earlier_files(old, meta) if old is not None else {}
        for rel, entry in files.items():
            if old is not None and (old / META).is_file() and _intact(old, rel, entry):
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                os.rename(old / rel, tmp / rel)  # verified good: no need to fetch it again
                continue
            if (old is not None and rel in earlier and earlier[rel]["size"] < entry["size"]
                    and _intact(old, rel, earlier[rel])):
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                os.rename(old / rel, tmp / rel)  # the corpus grew by an append: the old bytes are its prefix
                kept[rel] = earlier[rel]["size"]
            to_copy[rel] = entry
        if old is not None:
            scratchmod.ensure_held(scratch)
            shutil.rmtree(old, ignore_errors=True)
        needed = sum(e["size"] - kept.get(rel, 0) for rel, e in to_copy.items())
        check_fit(needed, scratch, memory_headroom_bytes)
        check_inodes(len(to_copy) + 1, scratch)  # and meta.json; then the trainer's start: never stuck after staging
        if to_copy:
            log(f"staging: copying {len(to_copy)} file(s), {_mb(needed)}, from {source} to {scratch}")
        copier = _Copier(fs, root, source, needed, progress, retries, backoff_s, log)
        for rel, entry in to_copy.items():
            copier.copy(rel, entry, tmp / rel, kept.get(rel, 0))
        (tmp / META).write_bytes(meta_raw)
        from minilmd.corpus.format import verify_prepared

        problems = verify_prepared(tmp)
        if problems:
            raise SourceInvalid(f"{source}: the copied corpus fails its checks: " + "; ".join(problems[:5]))
        record_staged_from(scratch, None)  # no moment where the record names another copy than the one there
        publish_dir(tmp, final)
        record_staged_from(scratch, source)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    elapsed = time.monotonic() - copier.started
    log(f"staging: {final} ready ({_mb(needed)} copied in {elapsed:.1f}s)")
    return final
