"""Staging what a trainer start reads besides the corpus: the val split of `[eval] probe` and the weights
`[init] from` names, copied into scratch and verified, so that a trainer (re)start never reads shared storage.

Layout in scratch (docs/architecture.md, "The files of a run"):
- `probe/`: the probe corpus's meta.json (byte for byte) and its val split only (tokens.bin, doc_lengths.npy, and
  loss_mask.bin for a chat corpus), each file's size and sha256 those meta.json lists; the train split, which the
  probe never reads, is neither copied nor opened;
- `init/`: `source.json`, the fingerprint record of the source as init.from names it (its own path, its hashes:
  what every checkpoint of the run records, so lineage and `same_source` compare as if the source were read), and
  the copy: `checkpoint/` (a checkpoint directory, every file its manifest lists) or `weights.pth`.

Each is published by a rename only once verified, reused while it verifies, copied again when it does not.
init.from is fetched once per run: a verified copy of the same `from` is reused without reading the source (a LoRA
run's base must stay the one its checkpoints record anyway); the probe's source is read for a changed meta.json,
and its verified copy used while the source cannot be read.
A source that cannot be read (gone, EIO, a stalled mount that errors; a probe that is an empty directory too, a
mount point whose share is not mounted) raises SourceUnreachable: the staging worker waits and retries with backoff;
a source that is read and wrong raises SourceInvalid (exit 65) or InitSourceError (exit 2), final as before.
Torch-free; the blocking job of daemon/jobs/stagingworker.py.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from minilmd import init_stall
from minilmd.corpus_meta import CorpusError, listed_files, parse_meta
from minilmd.daemon.base.worker import ReadWatch
from minilmd.daemon.jobs import lorabase
from minilmd.daemon.jobs.staging_errors import ProbeUnreachable, SourceInvalid, SourceUnreachable
from minilmd.fsio import atomic_write_json, file_entry_problems, publish_dir
from minilmd.init_source import STAGED_CHECKPOINT as INIT_CHECKPOINT
from minilmd.init_source import STAGED_PTH as INIT_PTH
from minilmd.init_source import STAGED_RECORD as INIT_RECORD
from minilmd.init_source import staged_copy as staged_init_source
from minilmd.init_source import staged_record as read_init_record
from minilmd.names import COPY_CHUNK_BYTES as CHUNK
from minilmd.names import (
    CORPUS_META,
    CORPUS_META_MAX_BYTES,
    INIT_DIR,
    MANIFEST,
    MANIFEST_MAX_BYTES,
    SPLITS,
    STAGING_TMP_PREFIX,
)
from minilmd.untrusted import Unreadable, loads, sha256_regular

PROBE_DIR = "probe"


def _copy(src: Path, dest: Path, size: int | None = None, answered=lambda: None) -> tuple[int, str]:
    """Copy src to dest through untrusted.copy_regular (no link followed, never blocked, bounded), hashing as it
    goes, `answered()` after each block read; (bytes, sha256). With `size`, its first `size` bytes (an append writes
    a split's tail before its meta.json: it may be longer; a shorter one gives fewer, for the caller to compare with
    the listing); without, whole as it is now (what the room in scratch was counted for: one that grows while read
    is `changed`, never copied without end). What else the source is: `_unusable`; an OSError of dest's for the
    caller to call unreachable."""
    from minilmd.untrusted import Hashing, Unreadable, copy_regular

    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        sink = Hashing(_Answering(out, answered))
        try:
            done = copy_regular(src, sink, first=size, chunk=CHUNK)
        except Unreadable as e:
            raise _unusable(e, src) from None
        out.flush()
        os.fsync(out.fileno())
    return done, sink.sha256.hexdigest()


def _unusable(e, src: Path) -> SourceUnreachable | SourceInvalid:
    """An untrusted.Unreadable of a source file as staging takes it (the decision of the plain open() before):
    missing or an I/O error, or a file that changed under the read (replaced, another size than listed, grew):
    unreachable now, waited for (read again later); not a regular file (a FIFO, a link, a directory): final.
    Decided by the error's kind (untrusted.Kind), never by its words."""
    if e.kind in ("missing", "io"):
        return SourceUnreachable(f"{src}: cannot be read ({e.why})")
    if e.kind in ("link", "not_regular"):
        return SourceInvalid(f"{src}: {e.why}, not a regular file")
    return SourceUnreachable(f"{src}: {e.why} (written to now?)")  # changed, wrong_size, too_big: being written


class _Answering:
    """copy_regular's `out`: writes each block to the copy and says a chunk was read (the worker's stall watch)."""

    def __init__(self, out, answered):
        self.out, self.answered = out, answered

    def write(self, block: bytes) -> None:
        self.answered()
        self.out.write(block)


def _copy_listed(ckpt, rel: str, dest: Path, size: int, owners, answered) -> None:
    """Copy the file `rel` of init.from's checkpoint, opened in `ckpt` (the directory resolve judged, an init_place
    Dir) through its descriptor, to dest by untrusted.copy_regular: a regular file of one of `owners`, no link
    followed, never blocked, exactly its manifest's `size` (another size: read while it changes, waited for as
    `_unusable` says). A link, a FIFO or another owner's file there is final, named as the resolver names one
    (init_place.refusal). init_problems then checks its sha256 against the manifest."""
    from minilmd.init_place import refusal
    from minilmd.untrusted import Unreadable, copy_regular

    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        try:
            copy_regular(rel, _Answering(out, answered), size=size, chunk=CHUNK, dir_fd=ckpt.fd, owner=owners)
        except Unreadable as e:
            if e.kind in ("link", "not_regular", "owner"):
                raise SourceInvalid(str(refusal(ckpt, rel, e, owners))) from None
            raise _unusable(e, ckpt.path / rel) from None
        out.flush()
        os.fsync(out.fileno())


def _copy_checkpoint(spec: str, source, dest: Path, answered) -> dict:
    """init.from's checkpoint copied into dest from the very directory resolve opened and judged (init_place.reopen:
    that one or none), through its descriptor: its manifest read once (fingerprinted and kept as read), then each
    file it lists at the size it lists, each a regular file of the source's owner or ours. Its fingerprint record.
    A directory replaced since it was resolved is waited for (resolved again then: what stands there is judged)."""
    from minilmd.init_place import Moved, owners_of, read_in, reopen
    from minilmd.init_source import checkpoint_record

    try:
        with reopen(source.path, source.identity) as ckpt:
            owners = source.owners or owners_of(ckpt)
            raw = read_in(ckpt, MANIFEST, MANIFEST_MAX_BYTES, owners)
            record = {"from": spec, **checkpoint_record(source, raw)}
            files = manifest_files(loads(raw, expect=None))  # each with its size: what bounds the copy
            dest.mkdir()
            (dest / MANIFEST).write_bytes(raw)
            for rel, entry in files.items():
                _copy_listed(ckpt, rel, dest / rel, entry["size"], owners, answered)
    except Moved as e:
        raise SourceUnreachable(f"{e.filename}: {e.strerror}") from None
    except ValueError as e:  # init_place.Refused (a link, a FIFO, a third user's manifest), a bad manifest
        raise SourceInvalid(f"init.from = {spec!r}: {e}") from None
    except OSError as e:
        raise SourceUnreachable(f"{source.path}: cannot be read ({e})") from None
    return record


def _copy_pth(source, model: dict | None, dest: Path, answered) -> dict:
    """Copy init.from's .pth to dest in the one read that fingerprints it (init_pth.copy_pth: in the directory
    resolve pinned, through its descriptor, a file of its owner or ours, no link followed, never blocked, bounded
    by a state dict of the run's `model`); its record, with the size copied."""
    from minilmd.init_pth import copy_pth

    with open(dest, "wb") as out:
        record = copy_pth(source, model, _Answering(out, answered))
        out.flush()
        os.fsync(out.fileno())
        return {**record, "size": out.tell()}


def _read_source(path: Path, max_bytes: int, what: str) -> bytes:
    """A source's small file, as untrusted (another run's or user's share): never a link, a FIFO or /dev/zero read
    whole. Missing or an I/O error: SourceUnreachable; not a regular file, or too big: SourceInvalid."""
    from minilmd.untrusted import Unreadable, read_bytes

    try:
        return read_bytes(path, max_bytes=max_bytes)
    except Unreadable as e:
        if e.missing:
            raise SourceUnreachable(f"{path}: No such file or directory") from None
        if e.os_error is not None:
            raise SourceUnreachable(f"{path}: cannot be read ({e.os_error})") from None
        raise SourceInvalid(f"{path}: {e.why}; not a {what}") from None
    except OSError as e:
        raise SourceUnreachable(f"{path}: cannot be read ({e})") from None


def fresh_tmp(scratch: Path, name: str) -> Path:
    tmp = scratch / f"{STAGING_TMP_PREFIX}{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)  # one supervisor per run: anything here is from a dead attempt
    tmp.mkdir(parents=True)
    return tmp


@contextlib.contextmanager
def staged_whole(scratch: Path, name: str) -> Iterator[Path]:
    """A fresh temporary directory (fresh_tmp) to stage `<scratch>/<name>` in: published in its place (publish_dir)
    when the block ends, removed when anything is raised in it or by the publish (SIGTERM's KeyboardInterrupt too):
    a staged input is there whole or not at all."""
    tmp = fresh_tmp(scratch, name)
    try:
        yield tmp
        publish_dir(tmp, scratch / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --- the probe's val split ------------------------------------------------------------------------------------------
def _val_files(meta: dict, where: str) -> dict[str, dict]:
    try:
        files = listed_files(meta, where)
    except CorpusError as e:
        raise SourceInvalid(str(e)) from None
    val = {rel: e for rel, e in files.items() if PurePosixPath(rel).parts[0] == SPLITS[1]}
    if not val:
        raise SourceInvalid(f"{where}: meta.json lists no {SPLITS[1]}/ files: the probe has no val split")
    return val


def probe_problems(staged: Path) -> list[str]:
    """What fails in a staged probe (empty: good): meta.json there, every val file its meta.json lists with that
    size and sha256."""
    try:
        meta = parse_meta((staged / CORPUS_META).read_bytes(), str(staged / CORPUS_META))
        files = _val_files(meta, str(staged))
    except (OSError, CorpusError, SourceInvalid) as e:
        return [f"{staged}: {e}"]
    problems = []
    for rel, entry in files.items():
        try:
            if sha256_regular(staged / rel, size=entry["size"]) != entry["sha256"]:
                problems.append(f"{staged / rel}: differs from its {CORPUS_META} entry")
        except Unreadable as e:  # it names the file: a link, a FIFO, another size than listed
            problems.append(str(e))
        except OSError as e:
            problems.append(f"{staged / rel}: {e}")
    return problems


def stage_probe(source: str, scratch: Path, log=lambda msg: None, answered=lambda: None) -> Path:
    """`<scratch>/probe`: the probe corpus's meta.json and val split, verified; an earlier copy reused if it is of
    the same meta.json and verifies. `answered()` after each chunk read from the source."""
    root, final = Path(source), scratch / PROBE_DIR
    try:
        raw = _read_source(root / CORPUS_META, CORPUS_META_MAX_BYTES, "prepared corpus's meta.json")
    except SourceUnreachable as unread:
        why = _probe_meta_missing(root, source) or unread
        if isinstance(why, SourceUnreachable) and (final / CORPUS_META).is_file() and not probe_problems(final):
            log(f"staging: the probe source cannot be read ({why}): reusing its verified copy at {final}")
            return final
        raise why from None
    try:
        meta = parse_meta(raw, f"{source}/{CORPUS_META}")
    except CorpusError as e:
        raise SourceInvalid(str(e)) from None
    files = _val_files(meta, source)
    try:
        same = (final / CORPUS_META).read_bytes() == raw
    except OSError:
        same = False
    if same and not probe_problems(final):
        log(f"staging: reusing the verified probe copy at {final}")
        return final
    with staged_whole(scratch, PROBE_DIR) as tmp:
        for rel, entry in files.items():
            try:
                size, digest = _copy(root / rel, tmp / rel, entry["size"], answered)
            except OSError as e:
                raise SourceUnreachable(f"{root / rel}: cannot be read ({e})") from None
            if size != entry["size"] or digest != entry["sha256"]:
                raise SourceInvalid(f"{root / rel}: {size} bytes, sha256 {digest[:12]}, but its {CORPUS_META} "
                                    f"lists {entry['size']} bytes, sha256 {entry['sha256'][:12]}")
        (tmp / CORPUS_META).write_bytes(raw)
    log(f"staging: the probe's val split of {source} staged and verified at {final}")
    return final


def _probe_meta_missing(root: Path, source: str) -> SourceInvalid | SourceUnreachable | None:
    """What a probe source whose meta.json could not be read is (minilmd/shared_place.py decides, as for the main
    corpus): its share gone, an empty directory (a mount point whose share is not mounted) or one that cannot be
    listed is waited for, said in shared_place's words ("not there (its share gone?)"), as the main corpus's; a
    directory holding other files, or a file where the directory belongs, is not a prepared corpus (final). None
    when meta.json is there after all (its own read error stands)."""
    from minilmd.shared_place import Place, look

    found = look(root, CORPUS_META)
    if found.place is Place.THERE:
        return None
    if found.outage:
        return SourceUnreachable(f"{source}: {found}")
    if found.place is Place.NOT_A_DIRECTORY:
        return SourceInvalid(f"{source}: {found}")
    return SourceInvalid(f"{source}: no {CORPUS_META} (not an output of `minilmd prepare`)")


# --- init.from ------------------------------------------------------------------------------------------------------
def init_problems(staged: Path) -> list[str]:
    """What fails in a staged init (empty: good): the copy's hashes are the record's (a checkpoint's manifest
    sha256, and every file the manifest lists; a .pth's sha256)."""
    from minilmd.untrusted import Unreadable

    try:
        record = read_init_record(staged)
        copy = staged_init_source(staged)
        if record.get("kind") == "minimind":
            if isinstance(record.get("size"), int) and os.stat(copy).st_size != record["size"]:
                return [f"{copy}: {os.stat(copy).st_size} bytes, its record lists {record['size']}"]
            return [] if sha256_regular(copy) == record.get("sha256") else [f"{copy}: sha256 differs from the source's"]
        if sha256_regular(copy / MANIFEST) != record.get("manifest_sha256"):
            return [f"{copy / MANIFEST}: differs from the source's"]
        manifest = loads((copy / MANIFEST).read_bytes(), expect=None)
        return [f"{copy / rel}: differs from its {MANIFEST}" for rel, entry in manifest_files(manifest).items()
                if sha256_regular(copy / rel) != entry.get("sha256")]
    except (OSError, ValueError, Unreadable) as e:
        return [f"{staged}: {e}"]


def manifest_files(manifest) -> dict[str, dict]:
    """The files a checkpoint manifest lists (name: entry with its size and sha256), each entry checked by the
    rule minilmd/checkpoint.py checks a manifest by (fsio.file_entry_problems: a plain name, a size, a sha256)."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise ValueError(f"{MANIFEST}: no table of files with their sha256")
    problems = file_entry_problems(files, MANIFEST)
    if problems or MANIFEST in files:
        raise ValueError(problems[0] if problems else f"{MANIFEST}: lists itself")
    return files


def _resolve(spec: str, checkpoint: str):
    """init.from's source (`checkpoint`: init.checkpoint, "best" or "last"). What cannot be reached now is
    unreachable, what is there and wrong stays the InitSourceError it was (final): minilmd.init_source.resolve
    decides, as it does for the config check at the first launch."""
    from minilmd.init_source import InitSourceUnreachable, resolve

    try:
        return resolve(spec, checkpoint)
    except InitSourceUnreachable as e:
        raise SourceUnreachable(f"{spec}: {e}") from None


def stage_init(spec: str, scratch: Path, checkpoint: str = "best", log=lambda msg: None,
               answered=lambda: None, from_remote: Callable[[], bool] | None = None,
               trained_on: dict | None = None, model: dict | None = None) -> Path:
    """`<scratch>/init`: the weights init.from names (of a run or a root: its BEST or LATEST, as init.checkpoint
    says), copied and verified, with their fingerprint record; an earlier copy reused while it is of the same source
    and verifies (a run that changes init.checkpoint later resumes from its own checkpoints, or, with LoRA, is
    refused for a changed base). `from_remote()`, tried before init.from is read again, stages the base a LoRA
    run's checkpoint was trained on from its copy on the remote (True when it did: daemon/jobs/basecopy.py).
    `trained_on`: the base the newest checkpoint of a LoRA run records (lorabase.trained_on); a staged copy of
    another base is not reused for its resume. `model`: the run's [model] (cfg.model_dict()), which bounds the
    size of a .pth read (model_shapes.pth_bound; without it, init_pth.MAX_PTH_BYTES). `answered()` after each
    chunk read from the source."""
    from minilmd.init_source import same_source

    final = scratch / INIT_DIR
    try:
        staged = read_init_record(final)
    except Exception:  # noqa: BLE001 - no earlier copy, or one not ours to reuse: stage anew
        staged = {}
    if staged.get("from") == spec and trained_on is not None and not same_source(trained_on, staged):
        # init.from changed before it was staged (a remote that failed once, on main): reusing it would have the
        # trainer refuse the base for good (exit 2) at every start
        log(f"staging: the copy of init.from at {final} is not the base the newest checkpoint was trained on: "
            f"staging that base again")
    elif staged.get("from") == spec and not init_problems(final):  # fetched once per run: not read again
        log(f"staging: reusing the verified copy of init.from at {final}")
        return final
    if from_remote is not None and from_remote():
        return final
    source = _resolve(spec, checkpoint)
    with staged_whole(scratch, INIT_DIR) as tmp:
        if source.kind == "checkpoint":
            record = _copy_checkpoint(spec, source, tmp / INIT_CHECKPOINT, answered)
        else:  # fingerprinted by the one read that copies it; its size recorded: what bounds the download of its
            try:  # copy on the remote (basecopy.fetch)
                record = {"from": spec, **_copy_pth(source, model, tmp / INIT_PTH, answered)}
            except ValueError as e:  # its InitSourceError: a link, a FIFO, too big for the run's model (final)
                raise SourceInvalid(f"init.from = {spec!r}: {e}") from None
            except OSError as e:
                raise SourceUnreachable(f"{source.path}: cannot be read ({e})") from None
        atomic_write_json(tmp / INIT_RECORD, record)
        problems = init_problems(tmp)
        if problems:  # read while it changed (a predecessor's retention?): try again later, never train on it
            raise SourceUnreachable(f"init.from = {spec!r}: the copy does not verify: {problems[0]}")
    log(f"staging: init.from {spec} staged and verified at {final}")
    return final


# --- what the staging worker asks ------------------------------------------------------------------------------------
def needed(cfg) -> list[str]:
    """What this start reads besides the corpus: "probe" with an [eval] probe; "init" for a LoRA run (its base, at
    every start) or a run with init.from and no checkpoint yet in scratch (a resumed run never reads it again)."""
    from minilmd.checkpoint_dirs import list_checkpoints

    out = ["probe"] if cfg.eval.probe else []
    if cfg.init.from_ and (cfg.lora.enabled or not _any_checkpoint(cfg.checkpoint_dir, list_checkpoints)):
        out.append("init")
    return out


def _any_checkpoint(root: Path, list_checkpoints) -> bool:
    try:
        return bool(list_checkpoints(root))
    except OSError:  # scratch not readable: as none (staging itself says what is wrong)
        return False


def space_parts(cfg) -> list[tuple[int, str]]:
    """(bytes, what for) of the copies `needed` names, as their sources list them before anything is staged: the
    probe's meta.json and val split (its meta.json's sizes), init.from's checkpoint (its manifest's sizes) or .pth
    (its size); for the space check of the launch (daemon/jobs/scratch_room.py `run_space_need`). A source that cannot
    be read or is wrong counts as nothing here: staging waits for it, or the config check refuses it."""
    from minilmd.init_place import owners_of, read_in, reopen
    from minilmd.init_source import InitSourceError, resolve
    from minilmd.untrusted import Unreadable, read_bytes

    what, parts = needed(cfg), []
    if "probe" in what:
        try:
            raw = read_bytes(Path(cfg.eval.probe) / CORPUS_META, max_bytes=CORPUS_META_MAX_BYTES)
            files = _val_files(parse_meta(raw, f"{cfg.eval.probe}/{CORPUS_META}"), cfg.eval.probe)
            parts.append((len(raw) + sum(e["size"] for e in files.values()), "for the probe's val split"))
        except (Unreadable, CorpusError, SourceInvalid):
            pass
    if "init" in what:
        try:
            source = resolve(cfg.init.from_, cfg.init.checkpoint)
            if source.kind == "checkpoint":  # in the directory resolve judged, as staging reads it
                with reopen(source.path, source.identity) as ckpt:
                    raw = read_in(ckpt, MANIFEST, MANIFEST_MAX_BYTES, source.owners or owners_of(ckpt))
                entries = manifest_files(loads(raw, path=source.path / MANIFEST)).values()
                size = len(raw) + sum(e["size"] for e in entries if isinstance(e.get("size"), int))
            else:
                size = os.stat(source.path).st_size
            parts.append((size, "for the staged copy of init.from"))
        except (InitSourceError, ValueError, OSError):  # Unreadable and a bad manifest are ValueErrors too
            pass
    return parts


def present(cfg, staged: dict[str, str]) -> bool:
    """Every input this start needs is staged and still in scratch (a cleaner or a reboot may have emptied it)."""
    marks = {"eval.probe_staged": CORPUS_META, "init.staged": INIT_RECORD}
    wanted = {"probe": "eval.probe_staged", "init": "init.staged"}
    return all(wanted[n] in staged and (Path(staged[wanted[n]]) / marks[wanted[n]]).is_file() for n in needed(cfg))


def problems(staged: dict[str, str]) -> list[str]:
    """What fails verification in the staged inputs (their sizes and hashes)."""
    out = probe_problems(Path(staged["eval.probe_staged"])) if "eval.probe_staged" in staged else []
    return out + (init_problems(Path(staged["init.staged"])) if "init.staged" in staged else [])


def stage_inputs(cfg, log=lambda msg: None, reads: ReadWatch | None = None, base_from_remote=None) -> dict[str, str]:
    """Stage what `needed` names; the `--set` overrides that give the trainer the staged copies. `reads` is told
    which source is read, and each chunk read from it (the worker shows a source whose reads block as stalled).
    `base_from_remote(cfg, trained_on, log, reads)`: stage_init's from_remote (basecopy.stage_from_remote). A LoRA
    run whose newest checkpoint was trained on another init.from is refused first (lorabase.refuse_another_base)."""
    what, reads = needed(cfg), reads or ReadWatch()
    if "init" in what:  # before anything is staged: <scratch>/init may be the base its adapters were trained on
        lorabase.refuse_another_base(cfg)
    sets = {}
    try:
        if "probe" in what:
            reads.reading(f"[eval] probe {cfg.eval.probe}")
            try:
                sets["eval.probe_staged"] = str(stage_probe(cfg.eval.probe, cfg.scratch_dir, log, reads.answer))
            except SourceUnreachable as e:  # said as the probe's, not init.from's
                raise ProbeUnreachable(f"eval.probe: {e}") from None
        if "init" in what:
            base = lorabase.trained_on(cfg) if cfg.lora.enabled else None
            reads.reading(init_stall.what(cfg.init.from_))

            def from_remote() -> bool:
                try:
                    return base_from_remote(cfg, base, log, reads)
                finally:
                    reads.reading(init_stall.what(cfg.init.from_))  # read next, when the remote has no copy

            sets["init.staged"] = str(stage_init(cfg.init.from_, cfg.scratch_dir, cfg.init.checkpoint, log,
                                                 reads.answer, None if base_from_remote is None else from_remote,
                                                 base, cfg.model_dict()))
    finally:
        reads.reading("")
    return sets
