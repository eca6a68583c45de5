"""A LoRA base's kept copy (`<remote>/init`, `<scratch>/init`: daemon/jobs/basecopy.py's layout) read as untrusted,
for `export --merge` and `sample` of an adapter whose recorded base is gone (trainer/model/adapter.py).

The remote is a place other users and machines write, so the copy there may hold a FIFO nobody writes, a link to
/dev/zero or a sparse terabyte where its weights belong. It is never read in place: `private_copy` copies it into
a private directory of this process, each of its directories walked to once without following a link
(remote_write.parent_dir: a directory must be one, not a link to one) and every file of it opened at that descriptor
(never by a path looked up again, where a directory swapped for a link after its look would be followed), as
minilmd/untrusted.py opens one (regular, no link, never blocked) and read for
its listed size only (what the record and manifest list is minilmd/base_copy.py's reading, the one the daemon's
fetch makes too): the record (`source.json`) bounded, the manifest bounded and hashed to the record's
manifest_sha256, each checkpoint file of its manifest's size, a `.pth` of the size its record lists (a record
written before records held it: no bigger than the model's weights can be). The strict validation then reads
only the private copy (every hash against the record, adapter.py's `_load_base`): what it checked is what gets
loaded. Torch-free.
"""
from __future__ import annotations

import contextlib
import errno
from pathlib import Path

from minilmd.base_copy import (
    MANIFEST_PATH,
    copy_of,
    listed_files,
    needs_manifest,
    parse_record,
)
from minilmd.daemon.jobs import remote_write
from minilmd.init_source import STAGED_CHECKPOINT, STAGED_RECORD
from minilmd.init_words import describe
from minilmd.model_shapes import pth_bound
from minilmd.names import MANIFEST, MANIFEST_MAX_BYTES, STAGED_RECORD_MAX_BYTES
from minilmd.trainer.model.export_paths import ExportError
from minilmd.untrusted import Unreadable, copy_regular, read_bytes


def private_copy(copy: Path, recorded: dict, model_cfg: dict, dest: Path) -> bool:
    """Copy the base kept at `copy` into the empty private directory dest, read as untrusted (the module
    docstring); False when there is no copy there. ExportError when there is one that is not usable: of another
    base, or a file in it that is not what its record and manifest list (said in words: "a FIFO", "a symbolic
    link", "over 512 MiB", "1099511627776 bytes, listed as 31328"); what they list is minilmd/base_copy.py's
    reading, the one the daemon's fetch of the copy makes."""
    try:
        with contextlib.ExitStack() as held:
            top = _walk(held, copy, (STAGED_RECORD,))
            if top is None:
                return False
            try:
                raw = _read(top, copy, STAGED_RECORD, STAGED_RECORD_MAX_BYTES)
            except Unreadable as e:
                if e.missing:
                    return False
                raise
            record = parse_record(raw, str(copy / STAGED_RECORD))
            if not copy_of(record, recorded.get("from"), recorded):
                raise ExportError(f"it is a copy of another base, {describe(record)}")
            manifest, fd_of = None, {"": top}
            if needs_manifest(record):
                checkpoint = _walk(held, copy, (STAGED_CHECKPOINT, MANIFEST))
                if checkpoint is None:
                    raise Unreadable("missing", copy / STAGED_CHECKPOINT, missing=True)
                fd_of[STAGED_CHECKPOINT] = checkpoint
                manifest = _read(checkpoint, copy, MANIFEST_PATH, MANIFEST_MAX_BYTES)
            files = listed_files(record, manifest, pth_bound(model_cfg), str(copy))
            if manifest is not None:  # the manifest as read and checked, not read again
                (dest / STAGED_CHECKPOINT).mkdir()
                (dest / MANIFEST_PATH).write_bytes(manifest)
            for rel, (size, bound) in files.items():
                with open(dest / rel, "xb") as out:
                    try:
                        copy_regular(rel.rpartition("/")[2], out, size=size, max_bytes=bound,
                                     dir_fd=fd_of[rel.rpartition("/")[0]])
                    except Unreadable as e:
                        raise _named(e, copy / rel) from None
        (dest / STAGED_RECORD).write_bytes(raw)  # last, as staging writes it
    except Unreadable as e:
        raise ExportError(str(e)) from None
    return True


def _walk(held: contextlib.ExitStack, copy: Path, names: tuple[str, ...]) -> int | None:
    """A descriptor of the directory of the copy that holds names[-1] (the copy itself, or its checkpoint
    directory), walked to from the copy's parent one directory at a time, none followed if a link
    (remote_write.parent_dir, as daemon/jobs/remote.py reads a local remote), held open by `held`: every file of it is
    read at that descriptor, never by a path looked up again. None when a directory on the way is missing;
    Unreadable when one is a link or not a directory."""
    below = copy.parent
    try:
        return held.enter_context(remote_write.parent_dir(str(below), (copy.name, *names),
                                                          lambda *parts: str(below.joinpath(*parts)))).fd
    except remote_write.NotOurs as e:
        raise Unreadable(str(e.strerror), kind="link" if e.errno == errno.ELOOP else None) from None
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Unreadable(f"cannot be read: {e.strerror or e}", copy, os_error=e) from None


def _read(fd: int, copy: Path, rel: str, max_bytes: int) -> bytes:
    """The file rel of the copy, its last name read at `fd` (its directory, _walk's) as untrusted."""
    try:
        return read_bytes(rel.rpartition("/")[2], max_bytes=max_bytes, dir_fd=fd)
    except Unreadable as e:
        raise _named(e, copy / rel) from None


def _named(e: Unreadable, path: Path) -> Unreadable:
    """e named by the file's whole path (a read at a descriptor knows only its last name)."""
    return Unreadable(e.why, path, kind=e.kind, os_error=e.os_error)
