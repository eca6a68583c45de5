"""A LoRA base's kept copy (`<remote>/init`, `<scratch>/init`: daemon/jobs/basecopy.py's layout) read as untrusted,
for `export --merge` and `sample` of an adapter whose recorded base is gone (trainer/model/adapter.py).

The remote is a place other users and machines write, so the copy there may hold a FIFO nobody writes, a link to
/dev/zero or a sparse terabyte where its weights belong. It is never read in place: `private_copy` copies it into
a private directory of this process, every path looked at without following a link (a directory must be one, not
a link to one), every file opened as minilmd/untrusted.py opens one (regular, no link, never blocked) and read for
its listed size only (what the record and manifest list is minilmd/base_copy.py's reading, the one the daemon's
fetch makes too): the record (`source.json`) bounded, the manifest bounded and hashed to the record's
manifest_sha256, each checkpoint file of its manifest's size, a `.pth` of the size its record lists (a record
written before records held it: no bigger than the model's weights can be). The strict validation then reads
only the private copy (every hash against the record, adapter.py's `_load_base`): what it checked is what gets
loaded. Torch-free.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from minilmd.base_copy import (
    MANIFEST_PATH,
    MAX_MANIFEST_BYTES,
    MAX_RECORD_BYTES,
    copy_of,
    listed_files,
    needs_manifest,
    parse_record,
)
from minilmd.init_source import STAGED_CHECKPOINT, STAGED_RECORD, describe
from minilmd.model_shapes import pth_bound
from minilmd.trainer.model.export_paths import ExportError
from minilmd.untrusted import Unreadable, copy_regular, file_kind, read_bytes


def private_copy(copy: Path, recorded: dict, model_cfg: dict, dest: Path) -> bool:
    """Copy the base kept at `copy` into the empty private directory dest, read as untrusted (the module
    docstring); False when there is no copy there. ExportError when there is one that is not usable: of another
    base, or a file in it that is not what its record and manifest list (said in words: "a FIFO", "a symbolic
    link", "over 512 MiB", "1099511627776 bytes, listed as 31328"); what they list is minilmd/base_copy.py's
    reading, the one the daemon's fetch of the copy makes."""
    try:
        if not _is_dir(copy):
            return False
        try:
            raw = read_bytes(copy / STAGED_RECORD, max_bytes=MAX_RECORD_BYTES)
        except Unreadable as e:
            if e.missing:
                return False
            raise
        record = parse_record(raw, str(copy / STAGED_RECORD))
        if not copy_of(record, recorded.get("from"), recorded):
            raise ExportError(f"it is a copy of another base, {describe(record)}")
        manifest = None
        if needs_manifest(record):
            if not _is_dir(copy / STAGED_CHECKPOINT):
                raise Unreadable("missing", copy / STAGED_CHECKPOINT, missing=True)
            manifest = read_bytes(copy / MANIFEST_PATH, max_bytes=MAX_MANIFEST_BYTES)
        files = listed_files(record, manifest, pth_bound(model_cfg), str(copy))
        if manifest is not None:  # the manifest as read and checked, not read again
            (dest / STAGED_CHECKPOINT).mkdir()
            (dest / MANIFEST_PATH).write_bytes(manifest)
        for rel, (size, bound) in files.items():
            with open(dest / rel, "xb") as out:
                copy_regular(copy / rel, out, size=size, max_bytes=bound)
        (dest / STAGED_RECORD).write_bytes(raw)  # last, as staging writes it
    except Unreadable as e:
        raise ExportError(str(e)) from None
    return True


def _is_dir(path: Path) -> bool:
    """Whether path is a directory itself (a link to one is refused: its files would be another place's)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as e:
        raise Unreadable(f"cannot be read: {e.strerror or e}", path, os_error=e) from None
    if not stat.S_ISDIR(mode):
        raise Unreadable(f"{file_kind(mode)}, not a directory", path,
                         kind="link" if stat.S_ISLNK(mode) else None)
    return True
