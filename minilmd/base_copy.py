"""A LoRA base's kept copy (`<remote>/init`: daemon/jobs/basecopy.py's layout, as staging writes `<scratch>/init`)
as its record and manifest list it: the one reading of what they say, for the two that take the copy from a place
others write. The daemon fetches it into scratch to resume a run (daemon/jobs/basecopy.py `fetch`, through its
Remote, which may not be local); `export --merge` and `sample` copy it into a private directory
(trainer/model/basecopy_read.py, local paths looked at without following a link). Each reads the bytes its own
way; what the bytes mean is decided here, once:
- the record (`source.json`) read bounded (STAGED_RECORD_MAX_BYTES), a JSON object, depth bounded;
- it is the copy wanted when its `from` is init.from's and its fingerprint the one the checkpoint records;
- a checkpoint's manifest read bounded (MANIFEST_MAX_BYTES), the very one the record hashes, a valid manifest whose
  file names stay inside the copy and which does not list itself; each file then of the size it lists;
- a `.pth` of the size its record lists (no hash covers that word), or none for a record from before records held
  it, bounded by the caller's `max_pth` (model_shapes.pth_bound of the model it is for).
Torch-free.
"""
from __future__ import annotations

import hashlib

from minilmd.checkpoint import manifest_problems
from minilmd.init_source import STAGED_CHECKPOINT, STAGED_PTH, STAGED_RECORD, same_source
from minilmd.names import MANIFEST
from minilmd.untrusted import Unreadable, loads

MANIFEST_PATH = f"{STAGED_CHECKPOINT}/{MANIFEST}"
"""The manifest of a checkpoint base, relative to the copy."""


def parse_record(raw: bytes, where: str = STAGED_RECORD) -> dict:
    """The record's bytes (read bounded by STAGED_RECORD_MAX_BYTES) as a JSON object. Raises Unreadable."""
    return loads(raw, expect=dict, path=where)


def copy_of(record: dict, spec: str | None, trained_on: dict | None) -> bool:
    """The record is of the base wanted: init.from `spec`, with the fingerprint `trained_on` records."""
    return record.get("from") == spec and same_source(trained_on, record)


def needs_manifest(record: dict) -> bool:
    """A checkpoint base (its manifest lists its files); else a `.pth` (its record lists it)."""
    return record.get("kind") != "minimind"


def listed_files(record: dict, manifest: bytes | None, max_pth: int | None,
                 where: str = "") -> dict[str, tuple[int | None, int | None]]:
    """{each file of the copy but the record and the manifest, relative to it: (the size listed, a bound on the
    size)}: a checkpoint's from `manifest` (its bytes as read, bounded by MANIFEST_MAX_BYTES: checked here to be
    the record's), a `.pth`'s from the record (None: a record from before sizes, bounded by `max_pth`). Raises
    Unreadable naming the file (under `where`, the copy as its caller shows it) when the manifest is not the one the
    record hashes or not a valid one."""
    if not needs_manifest(record):
        size = record.get("size")
        return {STAGED_PTH: (size if isinstance(size, int) else None, max_pth)}
    shown = f"{where}/{MANIFEST_PATH}" if where else MANIFEST_PATH
    if manifest is None or hashlib.sha256(manifest).hexdigest() != record.get("manifest_sha256"):
        raise Unreadable(f"not the manifest its {STAGED_RECORD} hashes", shown)
    parsed = loads(manifest, expect=None, path=shown)
    problems = manifest_problems(parsed)  # the file names too: no "/", no "..": nothing outside the copy
    if not problems and MANIFEST in parsed["files"]:
        problems = [f"{MANIFEST}: lists itself"]
    if problems:
        raise Unreadable("; ".join(problems), shown)
    return {f"{STAGED_CHECKPOINT}/{name}": (entry["size"], None) for name, entry in parsed["files"].items()}
