"""The LoRA base's durable copy: `<remote>/init`, beside the run's checkpoints on run.remote.

A LoRA checkpoint holds the adapters alone: resuming one needs the very base it was trained on. Its staged copy
(`<scratch>/init`, daemon/jobs/initstage.py) goes with /dev/shm at a reboot, and by then init.from may give other
weights (the predecessor run again: its BEST moved on) or none (retention deleted the step, the share is gone).
The run then could not finish: a changed base is refused (exit 2), a gone one waited for without end. So the sync
copies the staged base once to the remote (the same layout: `source.json` and `checkpoint/` or `weights.pth`;
files first, read back and hashed, the record last, then renamed into place where the store can rename, never
over a copy another machine published there since the push read it: Remote.publish_unless_taken), and a
LoRA start with a checkpoint to resume stages the base from there when its record is the one that checkpoint was
trained on, before it reads init.from again (a remote that cannot be read then is waited for: init.from may
hold other weights by now). `export --merge` and `sample` of an adapter whose recorded base is
gone read it there too (trainer/model/adapter.py). Torch-free.
"""
from __future__ import annotations

import contextlib
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from minilmd.base_copy import (
    MANIFEST_PATH,
    copy_of,
    listed_files,
    needs_manifest,
    parse_record,
)
from minilmd.daemon.base.worker import ReadWatch
from minilmd.daemon.jobs.initstage import INIT_DIR, INIT_RECORD, fresh_tmp, init_problems, manifest_files
from minilmd.daemon.jobs.remote import LeftAside
from minilmd.daemon.jobs.remote_local import open_remote
from minilmd.daemon.jobs.remote_store import RemoteStore
from minilmd.daemon.jobs.staging_errors import SourceUnreachable
from minilmd.fsio import publish_dir
from minilmd.init_source import STAGED_CHECKPOINT, STAGED_PTH, same_source
from minilmd.model_shapes import pth_bound
from minilmd.names import MANIFEST, MANIFEST_MAX_BYTES, STAGED_RECORD_MAX_BYTES
from minilmd.shared_place import Place
from minilmd.tmpnames import sync_tmp_name
from minilmd.untrusted import Unreadable, loads, read_bytes

REMOTE_BASE = INIT_DIR
"""Its name on the remote (never a step name: the sync's retention and listing pass it by)."""


class BaseCopyError(RuntimeError):
    """The copy to the remote failed to verify; retried with the next sync."""


def _recorded(staged: Path) -> dict[str, str]:
    """Each file of a staged base, relative to it, with the sha256 its record vouches for (a .pth's directly, a
    checkpoint's through the manifest the record hashes), the record itself last (what makes a copy exist): read
    once, so that a base staged again while it is copied never passes for the one recorded."""
    raw = read_bytes(staged / INIT_RECORD, max_bytes=STAGED_RECORD_MAX_BYTES)
    record = loads(raw, expect=dict)
    if record.get("kind") == "minimind":
        return {STAGED_PTH: str(record.get("sha256")), INIT_RECORD: hashlib.sha256(raw).hexdigest()}
    listed = read_bytes(staged / STAGED_CHECKPOINT / MANIFEST, max_bytes=MANIFEST_MAX_BYTES)
    if hashlib.sha256(listed).hexdigest() != record.get("manifest_sha256"):
        raise BaseCopyError(f"{staged / STAGED_CHECKPOINT / MANIFEST}: not the manifest its record hashes (staged "
                            f"again meanwhile?)")
    files = {f"{STAGED_CHECKPOINT}/{rel}": entry["sha256"]
             for rel, entry in manifest_files(loads(listed, expect=None)).items()}
    return {**files, f"{STAGED_CHECKPOINT}/{MANIFEST}": record["manifest_sha256"],
            INIT_RECORD: hashlib.sha256(raw).hexdigest()}


def _parts(rel: str) -> tuple[str, ...]:
    return tuple(rel.split("/"))


def on_remote(remote: RemoteStore, staged: Path) -> bool:
    """The remote holds this staged base: the same record, every file of the local size."""
    return _standing(remote, staged, _recorded(staged), _remote_record(remote)) == "this"


def staged_bytes(staged: Path) -> int | None:
    """The bytes of a staged base's files (what its copy needs on the remote); None when they cannot be read."""
    try:
        return sum((staged / rel).stat().st_size for rel in _recorded(staged))
    except (OSError, ValueError, KeyError, TypeError, BaseCopyError):  # Unreadable is a ValueError
        return None


def copy_in_place(remote: RemoteStore, staged: Path | None, trained_on: dict | None) -> bool:
    """Whether `<remote>/init` holds the LoRA base's copy, as a finished run's remote must (daemon/jobs/rundone.py):
    this staged base's (on_remote) while scratch holds it, else a copy whose record reads as one and is of the base
    the run's newest checkpoint records (`trained_on`; any base's, when no checkpoint in scratch says)."""
    if staged is not None and (staged / INIT_RECORD).is_file():
        with contextlib.suppress(OSError, ValueError, BaseCopyError):  # a staged base damaged: the record decides
            return on_remote(remote, staged)
    found = _remote_record(remote)
    if not isinstance(found, bytes):
        return False
    try:
        record = parse_record(found, remote.show(REMOTE_BASE, INIT_RECORD))
    except Unreadable:
        return False
    return trained_on is None or same_source(trained_on, record)


def push_or_say(remote: RemoteStore, staged: Path, host: str, pid: int, taken,
                passes: tuple[type[BaseException], ...] = (),
                ticks: int | None = None, boot: str = "") -> tuple[int, str | None, BaseException | None]:
    """push_found(), as (the bytes copied, why the remote holds no copy of this base: None when it does, the error
    the copy failed with: None when it did not); a copy that fails (an OSError, a backend error, BaseCopyError: all
    "try again at the next sync") is such a why too, and its error tells a full remote (ENOSPC, EDQUOT: the last
    sync waits for room) from any other. `passes`: what is raised on, not said (the sync's SyncAbandoned: the whole
    sync stops there)."""
    try:
        pushed = push_found(remote, staged, host, pid, taken, ticks, boot)
    except passes:
        raise
    except Exception as e:  # noqa: BLE001
        return 0, f"the LoRA base not copied to {remote.show(REMOTE_BASE)} ({type(e).__name__}: {e})", e
    return pushed.nbytes, pushed.missing, None


@dataclass(frozen=True)
class Pushed:
    """What a push did and found: the bytes copied, and why the remote holds no copy of this base after it (None:
    it does), said from the remote's record as the push read it, not read again."""

    nbytes: int
    missing: str | None = None


def _why_missing(remote: RemoteStore, found: bytes | Unreadable | None) -> str:
    """Why the remote holds no copy of this staged base, from its record as read (`found`, not this base's): what
    stands at `init` instead (another user's entry, a record that cannot be read as one, another base's copy). A
    LoRA run must not end `done` without its base's copy."""
    init = remote.show(REMOTE_BASE)
    if why := remote.why_foreign(REMOTE_BASE):
        return f"{init} is {why}, not this run's: its copy of the LoRA base cannot be made there"
    if isinstance(found, Unreadable):
        return f"{init} holds a {INIT_RECORD} that is not a base copy's record ({found}): never replaced"
    if found is not None:
        return f"{init} holds the copy of another LoRA base, never replaced"
    return f"{init} holds no copy of the LoRA base yet"


def _remote_record(remote: RemoteStore, name: str = REMOTE_BASE) -> bytes | Unreadable | None:
    """The record of the remote's `init` (or of the copy at `name`), read once: its bytes, None when there is none,
    or what stands there instead (a FIFO, a link, too big: Unreadable)."""
    try:
        return remote.cat(remote.path(name, INIT_RECORD), STAGED_RECORD_MAX_BYTES)
    except FileNotFoundError:
        return None
    except Unreadable as e:
        return None if e.missing else e


def _record_hash(found: bytes | Unreadable | None) -> str | None:
    return hashlib.sha256(found).hexdigest() if isinstance(found, bytes) else None


def _standing(remote: RemoteStore, staged: Path, hashes: dict[str, str], found: bytes | Unreadable | None) -> str:
    """What the remote's `init` is, from its record as read once (`found`) and the staged base's `hashes`
    (_recorded): "this" (this staged base, every file of the local size), "another" (another base's copy, or a
    record that cannot be read as one: never replaced), "" (none, or a damaged copy of this base: copied)."""
    if found is None:
        return ""
    if _record_hash(found) != hashes[INIT_RECORD]:  # an Unreadable record included
        return "another"
    whole = all(remote.size(REMOTE_BASE, *_parts(rel)) == (staged / rel).stat().st_size for rel in hashes)
    return "this" if whole else ""


def push(remote: RemoteStore, staged: Path, host: str, pid: int, taken=lambda found, fresh: None) -> int:
    """push_found's bytes copied (0: none, whatever the reason)."""
    return push_found(remote, staged, host, pid, taken).nbytes


def push_found(remote: RemoteStore, staged: Path, host: str, pid: int, taken=lambda found, fresh: None,
               ticks: int | None = None, boot: str = "") -> Pushed:
    """Copy the staged base to `<remote>/init` unless it is there already; the bytes copied (0: it was there, or the
    remote holds the copy of another base, which is never replaced: it may be the only copy of the weights older
    checkpoints were trained on; so is one another machine published after the record's read, by the time this copy is
    renamed into place on a local remote: only this push's copy is removed then), and why the remote holds no copy of it
    then (Pushed.missing, from the record this push read). OSError or BaseCopyError for the sync to retry; a half copy
    is never left behind. `taken`: Remote.make_tmp's, when the temporary name holds what is not ours. `ticks`, `boot`:
    the maker's start time and boot tag, which the temporary name records after its pid (tmpnames.sync_tmp_name; None,
    "": not recorded). On a store without rename (an fsspec URL) the copy is written in place, after what stands at
    `init` is removed, and only when the record read again just before that removal is still the one first read (0
    otherwise, as for another's): a copy another machine publishes there in the window left, between that second read
    and the removal (one round trip to the store), is still removed."""
    hashes = _recorded(staged)
    # the remote's record read once and acted on as read: another machine writes there, so a second read could
    # find no record where the first found another base's, and that copy would be replaced
    found = _remote_record(remote)
    if standing := _standing(remote, staged, hashes, found):
        return Pushed(0, None if standing == "this" else _why_missing(remote, found))
    # no rename on this store, so no way to publish only where nothing else took `init` since the read: the last
    # look as close to the removal as it can be (see the docstring for what remains)
    if not remote.renames_into_place and (again := _remote_record(remote)) != found:
        return _as_found(remote, staged, hashes, again)
    target = sync_tmp_name(REMOTE_BASE, host, pid, ticks, boot) if remote.renames_into_place else REMOTE_BASE
    # what an earlier push of this process left under this name, when it could neither put back nor set aside what
    # stood at `init`, is another base's copy: a fresh name then, never that one removed
    target = remote.make_tmp(target, STAGED_CHECKPOINT, taken=taken,
                             kept=lambda name: _kept_there(remote, name, hashes[INIT_RECORD]))
    try:
        nbytes = 0
        # each read back against the record, not the local file: a base staged again meanwhile leaves no mixed copy
        for rel, digest in hashes.items():
            copied = remote.put(staged / rel, target, *_parts(rel))
            nbytes += copied
            if remote.sha256(target, *_parts(rel), size=copied) != digest:  # read no further than it was written
                raise BaseCopyError(f"the copy of the LoRA base's {rel} at {remote.show(target)} is not the file "
                                    f"its record lists (read back differently, or staged again meanwhile)")
        # in place of what stood there only while that is still what was read (none, or a damaged copy of this
        # base): another machine's copy of another base published since the read stays, byte for byte
        if remote.renames_into_place and not remote.publish_unless_taken(
                target, REMOTE_BASE, replaceable=lambda name: _remote_record(remote, name) == found,
                ours=lambda name: _record_hash(_remote_record(remote, name)) == hashes[INIT_RECORD]):
            remote.rm(target)
            # another machine published at `init` since the read (rare): what stands there now says why
            return _as_found(remote, staged, hashes, _remote_record(remote))
    except LeftAside:
        raise  # what stood at `init` lies at the name it says: never removed
    except BaseException:
        with contextlib.suppress(OSError):  # the copy's own error is the one raised
            remote.rm(target)
        raise
    return Pushed(nbytes)  # each file read back and hashed as its record lists: this base's copy


def _as_found(remote: RemoteStore, staged: Path, hashes: dict[str, str], found: bytes | Unreadable | None) -> Pushed:
    """Nothing copied, `found` being the record that stands at `init` now: this base's copy there or not, and why."""
    standing = _standing(remote, staged, hashes, found)
    return Pushed(0, None if standing == "this" else _why_missing(remote, found))


def _kept_there(remote: RemoteStore, name: str, ours: str) -> str | None:
    """What Remote.make_tmp must not remove at `name`, said: another base's copy left there (another_base_left)."""
    if not another_base_left(remote, name, ours):
        return None
    return f"{remote.show(name)} holds the copy of another LoRA base than this run's (left there by a push that " \
           f"could not put it back at {remote.show(REMOTE_BASE)}): never removed"


def staged_record_hash(staged: Path | None) -> str | None:
    """The sha256 of the record of this run's staged base (None: no staged base, or a record that cannot be read):
    what another_base_left compares with."""
    if staged is None:
        return None
    try:
        return hashlib.sha256(read_bytes(staged / INIT_RECORD, max_bytes=STAGED_RECORD_MAX_BYTES)).hexdigest()
    except (OSError, Unreadable):
        return None


def another_base_left(remote: RemoteStore, name: str, ours: str | None) -> bool:
    """Whether the temporary directory `name` of a local remote, which the sync's clean-up is about to remove, holds the
    record of a base copy (what makes one exist) other than the one whose sha256 is `ours` (this run's staged base's
    record, as push read it or staged_record_hash: None, none): what stood at `init` and a push moved out to look at
    (Remote.publish_unless_taken), left there when that push was killed. It may be the only copy of the base older
    checkpoints were trained on, so it is never removed. A record that cannot be read as one counts, and so does a
    look that fails; no record (a half copy of this host's) or this base's own record does not. Another user's entry
    or a link: no (the removal leaves it)."""
    if not remote.renames_into_place or remote.why_foreign(name):
        return False
    try:
        found = _remote_record(remote, name)
    except OSError:
        return True
    if found is None:
        return False
    return ours is None or _record_hash(found) != ours


def fetch(remote: RemoteStore, spec: str, trained_on: dict, dest: Path, answered=lambda: None,
          max_pth: int | None = None) -> list[str] | None:
    """Download `<remote>/init` into the empty directory dest when it is a copy of init.from `spec` with the
    fingerprint `trained_on` (what the checkpoint to resume records): None when the remote holds no such copy,
    else what fails to verify in the download (empty: good). The remote is a shared place: its record and manifest
    read bounded and once, what they list decided as `export --merge` decides it (minilmd/base_copy.py), every file
    checked regular and of its listed size before it is read, every hash checked. A .pth's size is the record's own
    word, which no hash covers: `max_pth` (model_shapes.pth_bound of the run's model) bounds it, so that a record
    listing a sparse terabyte never has it downloaded into scratch."""
    try:
        raw = remote.cat(remote.path(REMOTE_BASE, INIT_RECORD), STAGED_RECORD_MAX_BYTES)
    except FileNotFoundError:
        return None
    except Unreadable as e:
        return [f"{remote.show(REMOTE_BASE, INIT_RECORD)}: {e.why}"]
    try:
        record = parse_record(raw, remote.show(REMOTE_BASE, INIT_RECORD))
        if not copy_of(record, spec, trained_on):
            return None
        listed = remote.cat(remote.path(REMOTE_BASE, *_parts(MANIFEST_PATH)), MANIFEST_MAX_BYTES) \
            if needs_manifest(record) else None
        files = listed_files(record, listed, max_pth, remote.show(REMOTE_BASE))
    except (FileNotFoundError, Unreadable) as e:
        return [str(e) if isinstance(e, Unreadable) else f"{remote.show(REMOTE_BASE)}: {e}"]
    # a record written before it held the .pth's size: the size listed now bounds the download
    sizes = {rel: remote.size(REMOTE_BASE, *_parts(rel)) if size is None else size for rel, (size, _) in files.items()}
    bounds: dict[str, int] = {rel: size for rel, size in sizes.items() if isinstance(size, int)}
    for rel, (_, most) in files.items():
        if most is not None and bounds.get(rel, 0) > most:
            return [f"{remote.show(REMOTE_BASE, rel)}: listed as {bounds[rel]} bytes, more than a .pth of this run's "
                    f"model can be ({most})"]
    problems = remote.not_regular(REMOTE_BASE, list(sizes))
    problems += [f"{remote.show(REMOTE_BASE, rel)}: {remote.size(REMOTE_BASE, *_parts(rel))} bytes, listed as "
                 f"{size}" for rel, size in sizes.items()
                 if rel not in bounds or remote.size(REMOTE_BASE, *_parts(rel)) != size]
    if problems:
        return problems
    if listed is not None:  # the manifest as read and checked above, not read again
        (dest / STAGED_CHECKPOINT).mkdir()
        (dest / MANIFEST_PATH).write_bytes(listed)
    for rel, size in bounds.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        remote.get((REMOTE_BASE, *_parts(rel)), dest / rel, size, answered)  # never more than size + 1 bytes
        if (got := (dest / rel).stat().st_size) != size:  # written to since its size was listed
            return [f"{remote.show(REMOTE_BASE, rel)}: {'longer' if got > size else 'shorter'} than the {size} "
                    f"bytes listed, when read (written to meanwhile?)"]
    (dest / INIT_RECORD).write_bytes(raw)
    return init_problems(dest)


# --- what staging asks (daemon/jobs/initstage.py stage_inputs) -------------------------------------------------------
def stage_from_remote(cfg, trained_on: dict | None, log=lambda msg: None, reads: ReadWatch | None = None,
                      synced_before: bool = True) -> bool:
    """The base a LoRA run's newest local checkpoint was trained on (`trained_on`, lorabase.trained_on), from
    `<remote>/init` into `<scratch>/init`, verified; False when there is nothing to resume, no remote, or no
    usable copy there (logged when there was one): staging reads init.from then, as at the first start. A remote
    that cannot be read now (an error; its root not there or an empty directory) raises SourceUnreachable: waited
    for, never a fallback to init.from, which may hold other weights by now (staged, the trainer would refuse them
    for good). `synced_before`: a sync of this run has completed (state.json's remote_checkpoint), so its remote
    holds something; before that an empty remote is just one not written yet (a base damaged in scratch in the
    first 15 minutes is staged from init.from again, as it was staged first). `reads` is told what is read."""
    remote = _remote_of(cfg)
    if remote is None or not trained_on:
        return False
    reads = reads or ReadWatch()
    where = remote.show(REMOTE_BASE)
    reads.reading(f"the LoRA base's copy {where}")  # what a stall names: this, not init.from, is read now
    tmp = fresh_tmp(cfg.scratch_dir, INIT_DIR)
    try:
        # "no copy" only from a remote that answers: its share gone or not mounted holds the copy these checkpoints
        # need, and init.from may hold other weights by now
        if synced_before and (absent := _absent(remote)):
            raise SourceUnreachable(f"{remote.url}: {absent}")
        problems = fetch(remote, cfg.init.from_, trained_on, tmp, reads.answer, pth_bound(cfg.model_dict()))
        if problems == []:
            publish_dir(tmp, cfg.scratch_dir / INIT_DIR)
            log(f"staging: the LoRA base this run trained on fetched from {where} and verified "
                f"at {cfg.scratch_dir / INIT_DIR}")
            return True
    except SourceUnreachable:
        raise
    except Exception as e:  # noqa: BLE001 - an EIO, a stale mount, a store that errors: as a checkpoint fetch
        raise SourceUnreachable(f"{where}: cannot be read ({type(e).__name__}: {e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if problems:
        log(f"staging: the LoRA base's copy on the remote is not usable ({problems[0]}): reading init.from")
    return False


def _absent(remote: RemoteStore) -> str:
    """How the remote root is absent ("" when it answers; minilmd/shared_place.py decides, as staging does): not
    there (its share gone), an empty directory (a mount point whose share is not mounted reads as its empty stub),
    one that cannot be listed, or not a directory at all (the base's copy cannot be there either: waited for, never
    a fallback to init.from). A remote that holds checkpoints or anything else and no `init` simply has no copy yet
    (the first sync had not copied it)."""
    found = remote.look(REMOTE_BASE)
    return "" if found.place in (Place.THERE, Place.LACKS) else str(found)


def _remote_of(cfg) -> RemoteStore | None:
    """The remote that holds a LoRA run's base copy, None without one (or when it cannot be opened)."""
    if not (cfg.lora.enabled and cfg.run.remote):
        return None
    try:
        return open_remote(cfg.run.remote)
    except (ValueError, ImportError, OSError):
        return None
