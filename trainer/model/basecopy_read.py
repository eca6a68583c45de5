"""A LoRA base's kept copy (`<remote>/init`, `<scratch>/init`: daemon/jobs/basecopy.py's layout) read as untrusted,
for `export --merge` and `sample` of an adapter whose recorded base is gone (trainer/model/adapter.py).

The remote is a place other users and machines write, so the copy there may hold a FIFO nobody writes, a link to
/dev/zero or a sparse terabyte where its weights belong. It is never read in place: `private_copy` copies it into
a private directory of this process, every path looked at without following a link (a directory must be one, not
a link to one), every file opened as minilmd/untrusted.py opens one (regular, no link, never blocked) and read for
its listed size only: the record (`source.json`) bounded, the manifest bounded and hashed to the record's
manifest_sha256, each checkpoint file of its manifest's size, a `.pth` of the size its record lists (a record
written before records held it: no bigger than the model's weights can be). The strict validation then reads
only the private copy (every hash against the record, adapter.py's `_load_base`): what it checked is what gets
loaded. Torch-free.
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from minilmd.init_source import STAGED_CHECKPOINT, STAGED_PTH, STAGED_RECORD, describe, same_source
from minilmd.model_shapes import pth_bound
from minilmd.names import MANIFEST
from minilmd.trainer.model.export_paths import ExportError
from minilmd.untrusted import Unreadable, copy_regular, file_kind, loads, read_bytes

MAX_RECORD_BYTES, MAX_MANIFEST_BYTES = 64 * 1024, 16 * 1024 * 1024  # as staging reads them (init_source.py)


def private_copy(copy: Path, recorded: dict, model_cfg: dict, dest: Path) -> bool:
    """Copy the base kept at `copy` into the empty private directory dest, read as untrusted (the module
    docstring); False when there is no copy there. ExportError when there is one that is not usable: of another
    base, or a file in it that is not what its record and manifest list (said in words: "a FIFO", "a symbolic
    link", "over 512 MiB", "1099511627776 bytes, listed as 31328")."""
    try:
        if not _is_dir(copy):
            return False
        try:
            raw = read_bytes(copy / STAGED_RECORD, max_bytes=MAX_RECORD_BYTES)
        except Unreadable as e:
            if e.missing:
                return False
            raise
        record = loads(raw, path=copy / STAGED_RECORD)
        if record.get("from") != recorded.get("from") or not same_source(recorded, record):
            raise ExportError(f"it is a copy of another base, {describe(record)}")
        listed = record.get("size") if isinstance(record.get("size"), int) else None  # None: a record from before
        files: dict[str, tuple[int | None, int | None]] = {STAGED_PTH: (listed, pth_bound(model_cfg))} \
            if record.get("kind") == "minimind" else _checkpoint_files(copy, record, dest)
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
        raise Unreadable(f"cannot be read: {e.strerror or e}", path) from None
    if not stat.S_ISDIR(mode):
        raise Unreadable(f"{file_kind(mode)}, not a directory", path)
    return True


def _checkpoint_files(copy: Path, record: dict, dest: Path) -> dict[str, tuple[int | None, int | None]]:
    """{file under the copy: (its listed size, None)} of a checkpoint base; its manifest read bounded, checked
    to be the one the record hashes and copied to dest already."""
    from minilmd.checkpoint import manifest_problems

    checkpoint = copy / STAGED_CHECKPOINT
    if not _is_dir(checkpoint):
        raise Unreadable("missing", checkpoint)
    raw = read_bytes(checkpoint / MANIFEST, max_bytes=MAX_MANIFEST_BYTES)
    if hashlib.sha256(raw).hexdigest() != record.get("manifest_sha256"):
        raise Unreadable(f"not the manifest its {STAGED_RECORD} hashes", checkpoint / MANIFEST)
    manifest = loads(raw, expect=None, path=checkpoint / MANIFEST)
    problems = manifest_problems(manifest)  # the file names too: no "/", no "..": nothing outside the copy
    if not problems and MANIFEST in manifest["files"]:
        problems = [f"{MANIFEST}: lists itself"]
    if problems:
        raise Unreadable("; ".join(problems), checkpoint / MANIFEST)
    (dest / STAGED_CHECKPOINT).mkdir()
    (dest / STAGED_CHECKPOINT / MANIFEST).write_bytes(raw)
    return {f"{STAGED_CHECKPOINT}/{name}": (entry["size"], None) for name, entry in manifest["files"].items()}
