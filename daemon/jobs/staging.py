"""Staging: copy a prepared corpus from slow shared storage (an NFS path or any fsspec URL) into fast scratch.

The user's first crash was a SIGBUS from a page fault on an mmap'ed corpus file that NFS could not fill; the cure
is to train from a copy in RAM (or on local disk). Rules:
- check first that the copy fits: free space of the scratch filesystem and, for a tmpfs, available memory with
  headroom left for training; refuse with the whole arithmetic and a local-disk alternative otherwise (final:
  ScratchTooSmall). Before that, `run_space_problem()` (for `minilmd run --check` and the launch) checks that the
  corpus, the staged probe val split and init.from copy AND the checkpoints kept between two syncs fit;
- copy each file to a temporary name, hashing while copying; retry a failed or short copy with backoff;
- the final name `<scratch>/corpus` only ever holds a copy whose sizes and sha256 matched `meta.json` and whose
  invariants `minilmd.corpus.format.verify_prepared` accepted (the whole directory is published by a rename at the end);
- an existing staged copy is reused only after verification; after a SIGBUS the supervisor calls
  `verify_staged()` and stages again, which copies only the damaged files;
- nothing is removed in scratch unless it is still the directory the run claimed (minilmd/scratch.py
  `ensure_held`, asked right before each removal; the supervisor claims it again before each staging).
Torch-free.
"""
from __future__ import annotations

import hashlib
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import psutil

from minilmd import scratch as scratchmod
from minilmd.config import RunConfig
from minilmd.config_values import out_of_range, parse_duration
from minilmd.corpus.meta import MAX_META_BYTES, CorpusError, listed_files, loads_meta, parse_meta, read_corpus_meta
from minilmd.daemon.jobs.staging_errors import ScratchTooSmall, SourceInvalid, StagingError
from minilmd.fsio import dir_table_problems, is_local_fs, not_regular, publish_dir, table_problems
from minilmd.names import CORPUS_META as META
from minilmd.names import CORPUS_TOKENIZER, LOSS_MASK, STAGED_CORPUS, STAGING_OLD_PREFIX, STAGING_TMP_PREFIX, TOKENS
from minilmd.untrusted import Unreadable, read_bytes

CHUNK = 8 * 1024 * 1024
MIB = 1024 ** 2
GIB = 1024 ** 3
SPACE_MARGIN = 64 * MIB
"""Kept free on the scratch filesystem beyond the run's own files: a quarantined checkpoint, the temporary names of
a copy or a fetch in progress. Every refusal shows it."""
CHECKPOINT_BYTES_PER_PARAMETER = 12
"""fp32 weights (4) and AdamW's two fp32 moments (8), whatever the training precision."""
CHECKPOINT_OVERHEAD = 256 * 1024
"""A checkpoint's small files and safetensors headers, beyond its tensors and its tokenizer copy."""


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
    """meta["files"], checked by the prepared-corpus format (minilmd/corpus/meta.py); SourceInvalid if bad."""
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
        meta = loads_meta(read_bytes(root / META, max_bytes=MAX_META_BYTES))  # never a FIFO, never too deep
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
        raw = read_bytes(old / META, max_bytes=MAX_META_BYTES)
        old_meta = loads_meta(raw)
    except (OSError, ValueError):
        return {}
    digest = hashlib.sha256(raw).hexdigest()
    chain = {v.get("previous_meta_sha256") for v in meta.get("versions", []) if isinstance(v, dict)}
    if digest not in chain or not isinstance(old_meta, dict) or not isinstance(old_meta.get("files"), dict):
        return {}
    return {rel: e for rel, e in old_meta["files"].items()
            if PurePosixPath(rel).name in APPENDABLE and isinstance(e, dict) and isinstance(e.get("size"), int)}


# --- will it fit? ---------------------------------------------------------------------------------------------------
@dataclass
class SpaceNeed:
    """What a run needs in scratch, part by part, so that a refusal can show the whole sum."""

    parts: list[tuple[int, str]]
    """(bytes, what for), e.g. (5_300_000, "for the corpus")."""
    held: int = 0
    """Bytes this run's scratch already holds (a restart): they are part of `parts` and count as room."""
    margin: int = field(default=SPACE_MARGIN)

    @property
    def files(self) -> int:
        return sum(n for n, _ in self.parts)

    @property
    def total(self) -> int:
        return self.files + self.margin

    def describe(self) -> str:
        terms = [f"{_mb(n)} {what}" for n, what in self.parts]
        terms.append(f"a {self.margin / MIB:g} MiB margin ({_mb(self.margin)})")
        return " + ".join(terms) + f" = {_mb(self.total)}"


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


def fit_problem(need: SpaceNeed, scratch: str, mount: str, fstype: str, free_bytes: int,
                available_memory: int | None = None, headroom: int | None = None,
                alternative: str | None = None) -> str | None:
    """Why `need` does not fit in scratch (None: it fits). Pure arithmetic, so that it is testable.
    `available_memory` and `headroom` only count for a RAM disk (tmpfs, ramfs), whose pages are memory."""
    reasons = []
    if need.total > free_bytes + need.held:
        held = f" besides the {_mb(need.held)} this run's scratch already holds" if need.held else ""
        reasons.append(f"{mount} ({fstype or 'unknown fs'}) has {_mb(free_bytes)} free{held}")
    if fstype in ("tmpfs", "ramfs") and available_memory is not None and headroom is not None:
        adds = max(0, need.files - need.held)
        if available_memory - adds < headroom:
            reasons.append(f"{mount} is a RAM disk: {_mb(available_memory)} of memory is available, the run would "
                           f"take {_mb(adds)} more of it, and {_mb(headroom)} must stay free for training "
                           f"(max(2 GiB, 20 % of RAM))")
    if not reasons:
        return None
    hint = f"; set run.scratch to a local-disk directory, e.g. {alternative}" if alternative else \
        "; set run.scratch to a directory on a local disk with enough space"
    return f"run.scratch {scratch} needs {need.describe()}, but " + " and ".join(reasons) + hint


def _alternative_scratch(scratch: Path, needed: int) -> str | None:
    """A local-disk directory with room for the run, to name in the refusal (per user, like the default)."""
    for candidate in (Path("/var/tmp"), Path.home(), Path("/tmp")):
        try:
            if candidate.is_dir() and _mount_of(candidate)[1] not in ("tmpfs", "ramfs", "nfs", "nfs4"):
                st = os.statvfs(candidate)
                free = st.f_bavail * st.f_frsize
                if free > needed:
                    return f"{candidate / f'minilmd-{os.geteuid()}' / scratch.name} ({_mb(free)} free)"
        except OSError:
            continue
    return None


def space_problem(need: SpaceNeed, scratch_dir: Path, memory_headroom_bytes: int | None = None) -> str | None:
    """fit_problem() with the free space, filesystem and memory of where `scratch_dir` is (or will be). The memory
    headroom of a RAM disk defaults to max(2 GiB, 20 % of RAM)."""
    probe = _existing_ancestor(scratch_dir)
    st = os.statvfs(probe)
    mount, fstype = _mount_of(probe)
    vm = psutil.virtual_memory()
    headroom = memory_headroom(vm.total) if memory_headroom_bytes is None else memory_headroom_bytes
    free = st.f_bavail * st.f_frsize
    if fit_problem(need, str(scratch_dir), mount, fstype, free, vm.available, headroom) is None:
        return None
    return fit_problem(need, str(scratch_dir), mount, fstype, free, vm.available, headroom,
                       _alternative_scratch(scratch_dir, need.total))


def check_fit(needed: int, scratch_dir: Path, memory_headroom_bytes: int | None = None) -> None:
    """Raise ScratchTooSmall with the whole arithmetic if `needed` bytes of corpus files do not fit in
    scratch_dir."""
    problem = space_problem(SpaceNeed([(needed, "for the corpus files to copy")]), scratch_dir,
                            memory_headroom_bytes)
    if problem:
        raise ScratchTooSmall(problem)


def checkpoint_bytes(cfg: RunConfig, tokenizer_bytes: int) -> int:
    """The size of one checkpoint of this model: 12 bytes per parameter, the tokenizer copy, small files."""
    from minilmd.model_shapes import expected_state_shapes

    parameters = sum(math.prod(shape) for shape in expected_state_shapes(cfg.model).values())
    return parameters * CHECKPOINT_BYTES_PER_PARAMETER + tokenizer_bytes + CHECKPOINT_OVERHEAD


def checkpoints_kept(cfg: RunConfig) -> tuple[int, str]:
    """How many checkpoints scratch holds at most between two syncs, and the sum that gives it. Under the
    supervisor scratch is pruned after each verified sync down to keep_local (without a remote: at once), so every
    save since the last sync stays, and one more is being written."""
    t, keep = cfg.train, cfg.train.keep_local
    if not cfg.run.remote:
        return keep + 1, f"train.keep_local {keep} + 1 being written"
    every = t.checkpoint_every
    if isinstance(every, int):
        between = 1
        how = f"1 saved between two syncs (checkpoint_every is {every} steps, whose duration is not known before " \
              f"the run: counted as one)"
    else:
        between = math.ceil(parse_duration(cfg.sync.every) / parse_duration(every))
        how = f"{between} saved between two syncs (sync.every {cfg.sync.every!r} / checkpoint_every {every!r})"
    return keep + between + 1, f"train.keep_local {keep} + {how} + 1 being written"


def _bytes_under(root: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(root):  # never follows a link
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def run_space_need(cfg: RunConfig) -> SpaceNeed | None:
    """What the run needs in scratch: the corpus (every file meta.json lists), the staged probe val split and
    init.from copy (daemon/jobs/initstage.py `space_parts`: their sources' sizes) and the checkpoints kept between
    two syncs. None when the corpus's cannot be known before staging (a corpus behind a URL, an unreadable
    meta.json). Reads shared storage: `run_space_problem` asks it in a bounded thread."""
    from minilmd.daemon.jobs.initstage import space_parts

    meta = read_corpus_meta(cfg.data.prepared) if "://" not in cfg.data.prepared else None
    files = meta.get("files") if meta else None
    if not isinstance(files, dict) or not all(isinstance(e, dict) and isinstance(e.get("size"), int)
                                              for e in files.values()):
        return None
    corpus = sum(e["size"] for e in files.values()) + (Path(cfg.data.prepared) / META).stat().st_size
    tokenizer = files.get(CORPUS_TOKENIZER, {}).get("size", 0)
    count, why = checkpoints_kept(cfg)
    one = checkpoint_bytes(cfg, tokenizer)
    scratch = cfg.scratch_dir
    ours = scratch.is_dir() and not scratchmod.problems(scratch, cfg.run_dir, cfg.scratch_is_default)
    return SpaceNeed([(corpus, "for the corpus"), *space_parts(cfg),
                      (count * one, f"for {count} checkpoints of {_mb(one)} ({why})")],
                     held=_bytes_under(scratch) if ours else 0)


def run_space_problem(cfg: RunConfig) -> list[str]:
    """The run's corpus and checkpoints do not fit in its scratch: the refusal with the whole sum (a config
    check: `minilmd run --check` and the launch give it to load_config). Nothing when a value it needs is out of
    range (the config check says so) or the corpus cannot be read yet."""
    if out_of_range(cfg) or not cfg.data.prepared or not cfg.run.dir:
        return []
    from minilmd.probes import bounded_probe

    answered, need, _ = bounded_probe(run_space_need, cfg)  # a stalled source: staging's to wait for and show
    try:
        problem = space_problem(need, cfg.scratch_dir) if answered and need is not None else None
    except OSError:
        return []  # the paths are the config check's to report
    return [problem] if problem else []


# --- copying --------------------------------------------------------------------------------------------------------
def _open_source(source: str):
    import fsspec  # light, but only the supervisor needs it

    try:
        fs, root = fsspec.core.url_to_fs(source)
    except (ValueError, ImportError) as e:
        raise StagingError(f"cannot open corpus source {source!r}: {e}") from e
    return fs, root.rstrip("/")


def _read_meta(fs, root: str, source: str) -> tuple[bytes, dict]:
    try:  # a local source's meta.json as untrusted (minilmd/untrusted.py): never a FIFO or /dev/zero read whole
        path = f"{root}/{META}"
        raw = read_bytes(path, max_bytes=MAX_META_BYTES) if is_local_fs(fs) else fs.cat_file(path)
    except Unreadable as e:  # as cat_file's errors below, but a FIFO, a link, a directory, too big: final
        if e.os_error is not None:
            raise StagingError(f"{source}/{META}: cannot read ({e.os_error})") from e.os_error
        raise SourceInvalid(f"{source}: no meta.json (run `minilmd prepare` first)" if e.missing
                            else f"{source}/{META}: {e.why}") from None
    except FileNotFoundError:
        raise SourceInvalid(f"{source}: no meta.json (run `minilmd prepare` first)") from None
    except OSError as e:
        raise StagingError(f"{source}/{META}: cannot read ({e})") from e
    try:
        return raw, parse_meta(raw, f"{source}/{META}")
    except CorpusError as e:
        raise SourceInvalid(str(e)) from None



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
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                wait = self.backoff_s * 2 ** (attempt - 1)
                self.log(f"staging: retrying {rel} in {wait:.1f}s (attempt {attempt + 1} of {self.retries + 1}): "
                         f"{last}")
                time.sleep(wait)
            done_before = self.done
            try:
                size, digest = self._copy_once(rel, dest, entry["size"], keep)
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

    def _copy_once(self, rel: str, dest: Path, listed: int, keep: int = 0) -> tuple[int, str]:
        """Copy the first `listed` bytes of the source file (it may be longer: an append writes its tail before
        its meta.json); with keep, after dest's first `keep` bytes, which are hashed, not fetched."""
        h = hashlib.sha256()
        size = 0
        part = dest.with_name(dest.name + ".part")
        part.parent.mkdir(parents=True, exist_ok=True)
        if keep:
            with open(dest, "rb") as f:
                while size < keep and (chunk := f.read(min(CHUNK, keep - size))):
                    h.update(chunk)
                    size += len(chunk)
            part.unlink(missing_ok=True)
            os.link(dest, part)  # the same file: a failed attempt leaves dest's prefix (the next cuts it back)
        if is_local_fs(self.fs) and (kind := not_regular(f"{self.root}/{rel}")):  # a FIFO would block the copy
            raise SourceInvalid(f"{self.source}/{rel}: {kind}, not a regular file")
        try:
            with self.fs.open(f"{self.root}/{rel}", "rb") as src, open(part, "r+b" if keep else "wb") as out:
                if keep:
                    src.seek(keep)
                    out.truncate(keep)
                    out.seek(keep)
                while size < listed and (chunk := src.read(min(CHUNK, listed - size))):
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
    scratchmod.ensure_held(scratch)  # the scratch claimed (owner, no link, nobody else can swap it), and still it
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
        publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    elapsed = time.monotonic() - copier.started
    log(f"staging: {final} ready ({_mb(needed)} copied in {elapsed:.1f}s)")
    return final
