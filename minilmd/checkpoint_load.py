"""A checkpoint's parts for a loader, each file read once and what is loaded the bytes checked (minilmd/checkpoint.py
validates; this is its loading half): a resume's rank 0 validates and keeps what it loads in one read
(validated_for_loading), its other ranks read and check a checkpoint rank 0 validated (for_loading), a reader of
some of a checkpoint's files checks each against one reading of its manifest (listed_files). Torch-free, as
checkpoint.py is; the tensors are made over these buffers by trainer/checkpoint/held_tensors.py.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from minilmd import checkpoint_contents as contents
from minilmd.checkpoint import (
    JSON_PARTS,
    MAX_JSON_PART,
    hashed_bytes,
    manifest_problems,
    parse_json_parts,
    read_manifest,
    validate_keeping,
)
from minilmd.checkpoint_expect import CheckpointInvalid, Expectation
from minilmd.fsio import table_problems
from minilmd.names import MANIFEST, MODEL_FILE, OPTIMIZER_FILE
from minilmd.safetensors_scan import InMemory, in_memory, read_whole
from minilmd.untrusted import Unreadable


def validated_for_loading(ckpt_dir: str | os.PathLike, expected: Expectation | None = None,
                          carried: Mapping[str, int] | None = None) -> ForLoading:
    """validate(ckpt_dir, expected) and for_loading(ckpt_dir, carried) in one read of each file: ForLoading made of
    the very bytes validation hashed and scanned (a tensors' file in one buffer of its listed size; a file of
    `carried` listed over its bound refused unread). A resume validates each checkpoint it tries so (resume.py):
    the one it takes is hashed once, and nothing put in its place since is loaded. Raises as validate does."""
    path, carried = Path(ckpt_dir), dict(carried or {})
    state, _, _, scans, kept, opt_meta = validate_keeping(path, expected, (MODEL_FILE, OPTIMIZER_FILE, *carried),
                                                          carried)
    held = {name: scan.data for name, scan in scans.items() if scan.data is not None}
    model, optimizer = held[MODEL_FILE], held[OPTIMIZER_FILE]
    assert isinstance(model, bytearray) and isinstance(optimizer, bytearray)  # kept writable (_verify_files)
    return ForLoading(_in_memory(path, model, MODEL_FILE), _in_memory(path, optimizer, OPTIMIZER_FILE), state,
                      opt_meta, {name: bytes(data) for name in carried  # bytes: no copy (a carried file is kept so)
                                 if (data := held.get(name, kept.get(name))) is not None})


def listed_files(ckpt_dir: str | os.PathLike,
                 bounds: Mapping[str, int | None]) -> tuple[dict[str, bytes | None], dict]:
    """({name: its bytes} of each file `bounds` names, the manifest they were checked against): one reading of the
    manifest, and each file read once, no more than its bound (None: the size its manifest lists), checked against
    its entry as verify_manifest checks every file (size, then sha256): the bytes checked, never a path read again.
    None for a name the manifest does not list. Raises CheckpointInvalid."""
    ckpt_dir = Path(ckpt_dir)
    manifest = read_manifest(ckpt_dir)
    problems = manifest_problems(manifest)
    if problems:
        raise CheckpointInvalid(ckpt_dir, problems)
    found: dict[str, bytes | None] = {}
    for name, most in bounds.items():
        entry = manifest["files"].get(name)
        found[name] = None if entry is None else _checked_bytes(ckpt_dir, name, entry, most)
    return found, manifest


def _checked_bytes(ckpt_dir: Path, name: str, entry: dict, most: int | None) -> bytes:
    """The file `name` read once, no more than `most` (None: its listed size), checked against its manifest entry
    (size, then sha256). Raises CheckpointInvalid."""
    try:
        digest, data = hashed_bytes(ckpt_dir / name, entry["size"], entry["size"] if most is None else most)
    except Unreadable as e:
        raise CheckpointInvalid(ckpt_dir, f"cannot read {name}: {e.why}") from None
    _check_entry(ckpt_dir, name, entry, len(data), digest)
    return data


def _checked_tensors(ckpt_dir: Path, name: str, entry: dict) -> InMemory:
    """A tensors' file read once into one buffer of its listed size (safetensors_scan.read_whole: the one reading of
    a file whole, a resume's rank 0's too), hashed and checked against its manifest entry (size, then sha256), its
    header parsed by the one parser (safetensors_scan.in_memory): the bytes a loader makes its tensors over, never
    copied. Raises CheckpointInvalid."""
    try:
        data = read_whole(ckpt_dir / name, entry["size"])
    except Unreadable as e:
        raise CheckpointInvalid(ckpt_dir, f"cannot read {name}: {e.why}") from None
    _check_entry(ckpt_dir, name, entry, len(data), hashlib.sha256(data).hexdigest())
    return _in_memory(ckpt_dir, data, name)


def _in_memory(ckpt_dir: Path, data: bytearray, name: str) -> InMemory:
    try:  # a bad header: the checkpoint invalid
        return in_memory(data, name)
    except ValueError as e:
        raise CheckpointInvalid(ckpt_dir, str(e)) from None


def _check_entry(ckpt_dir: Path, name: str, entry: dict, size: int, digest: str) -> None:
    """The size and sha256 of what was read of `name` against its manifest entry, as verify_manifest checks a file.
    Raises CheckpointInvalid."""
    problems = table_problems({name: entry}, lambda _: size, lambda _: digest, listed_in=MANIFEST)
    if problems:
        raise CheckpointInvalid(ckpt_dir, problems)


@dataclass(frozen=True)
class ForLoading:
    """What a loader takes of a checkpoint (trainer/checkpoint/save.py load): every part read once and checked
    against one reading of its manifest (listed_files), the JSON parts parsed from those bytes (depth bound, an
    object, the types a loader uses), the tensors' files held as read, their headers parsed (in_memory)."""

    model: InMemory
    optimizer: InMemory
    state: dict
    """trainer_state.json."""
    opt_meta: dict
    """optimizer.json."""
    carried: dict[str, bytes]
    """The other files asked for that the manifest lists (a DPO run's reference sums), by name."""


def for_loading(ckpt_dir: str | os.PathLike, carried: Mapping[str, int] | None = None) -> ForLoading:
    """A checkpoint's parts for a loader (ForLoading), the files of `carried` ({name: the most read}) too; the JSON
    parts no more than MAX_JSON_PART, read and checked first (a bad one is refused before the tensors' files are
    read), then the tensors' files, exactly their listed size, each into one buffer that its tensors are made over
    (_checked_tensors: the files' size in memory, once). A loader asks this of a checkpoint find_latest validated a
    moment ago: what it loads is what it checks now, not whatever the path holds since. Raises CheckpointInvalid."""
    ckpt_dir = Path(ckpt_dir)
    files, manifest = listed_files(ckpt_dir, {**dict.fromkeys(JSON_PARTS, MAX_JSON_PART), **(carried or {})})
    state, opt_meta = parse_json_parts(ckpt_dir, {name: data for name in JSON_PARTS
                                                              if (data := files[name]) is not None})
    problems = contents.structure_problems(state, opt_meta) or contents.step_problems(ckpt_dir, manifest["step"],
                                                                                       state)
    if problems:
        raise CheckpointInvalid(ckpt_dir, problems)
    listed = manifest["files"]  # REQUIRED_FILES: manifest_problems refused one unlisted
    return ForLoading(_checked_tensors(ckpt_dir, MODEL_FILE, listed[MODEL_FILE]),
                      _checked_tensors(ckpt_dir, OPTIMIZER_FILE, listed[OPTIMIZER_FILE]), state, opt_meta,
                      {name: data for name in carried or {} if (data := files[name]) is not None})
