"""Checkpoints: written atomically, validated strictly, found again after any crash.

A checkpoint is a directory `step-00001234/` under a root (local scratch, or the remote):

    model.safetensors      fp32 weights; keys and shapes exactly those of model_shapes.expected_state_shapes
    optimizer.safetensors  the optimizer's tensors, flattened as `state.<param index>.<name>`
    optimizer.json         param_groups and the non-tensor parts of the optimizer state (no pickle anywhere)
    trainer_state.json     step, tokens seen, data cursor, RNG states, run config, fingerprints of data/tokenizer
    tokenizer.json         a copy of the run's tokenizer, when the trainer gives one (for sample/export)
    tokenizer_config.json  the chat template beside that tokenizer, when the run trains on a chat corpus
    manifest.json          size and sha256 of every other file; written LAST

Protocol of `save`: write into `.tmp-step-XXXXXXXX-<pid>-<start ticks>-boot<boot tag>/` (tmpnames.save_tmp_name), fsync
every file, write the manifest, fsync the directory, rename it to `step-XXXXXXXX/`, fsync the root, then replace
`LATEST` atomically. A directory without a manifest does not exist for any reader here; `LATEST` is for humans and
scripts, readers here scan the directories.

This module is the format and its validation, torch-free (json, numpy, plain reads; never mmap, since a checkpoint
on NFS must not be able to kill the reader with SIGBUS; the safetensors reading is minilmd/safetensors_scan.py):
the supervisor validates before it syncs. Every part of a checkpoint is untrusted, even when its hash matches the
manifest: a malformed one is CheckpointInvalid with the reason, never another exception. Finding the
checkpoints of a root (listing, LATEST, BEST, quarantine, stale temporaries) is minilmd/checkpoint_dirs.py, without
numpy; resuming and pruning, which validate as they walk a root, are minilmd/checkpoint_select.py; `minilmd verify`'s
report is minilmd/checkpoint_verify.py; what a loader takes, as validated (validated_for_loading, for_loading,
listed_files), is minilmd/checkpoint_load.py. The writing half
(`save`, `load`, `AsyncCheckpointer`, RNG states) needs torch and is `minilmd.trainer.checkpoint.save`.
"""
from __future__ import annotations

import hashlib
import io
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from minilmd import checkpoint_contents as contents
from minilmd.checkpoint_contents import saved_lora  # noqa: F401  (its callers' name for it)
from minilmd.checkpoint_dirs import read_latest  # noqa: F401  (the tests' name for it)
from minilmd.checkpoint_expect import (  # noqa: F401  (the errors: every reader's names for them)
    CheckpointError,
    CheckpointInvalid,
    CheckpointMismatch,
    Expectation,
    check_expectation,
)
from minilmd.corpus_meta import CORPUS_SUMMARY
from minilmd.fsio import file_entry_problems, table_problems
from minilmd.model_shapes import expected_adapter_shapes, expected_state_shapes
from minilmd.names import CHECKPOINT_KILL_ENV as KILL_ENV  # noqa: F401  (the tests' name for it)
from minilmd.names import (
    MANIFEST,
    MANIFEST_MAX_BYTES,
    MODEL_FILE,
    OPTIMIZER_FILE,
    OPTIMIZER_META,
    TOKENIZER_CONFIG,
    TOKENIZER_CONFIG_MAX_BYTES,
    TOKENIZER_FILE,
    TOKENIZER_MAX_BYTES,
    TRAINER_STATE,
    TRAINER_STATE_MAX_BYTES,
    step_of,  # noqa: F401  (the tests' name for it)
)
from minilmd.safetensors_scan import MAX_HEADER, Scan, scan_safetensors
from minilmd.untrusted import (
    Hashing,
    Unreadable,
    copy_regular,
    file_kind,
    loads,
    read_bytes,
    sha256_regular,
    size_text,
)

FORMAT = "minilmd-checkpoint"
VERSION = 1
REQUIRED_FILES = (MODEL_FILE, OPTIMIZER_FILE, OPTIMIZER_META, TRAINER_STATE)

# Test-only: KILL_ENV="point@step" makes `save` SIGKILL its own process at that point of the protocol for that
# step, so that tests can kill deterministically mid-save. The trainer's AsyncCheckpointer has one more,
# "before_prune": the checkpoint saved whole, the older ones not yet pruned.
KILL_POINTS = ("after_model", "before_manifest", "before_rename", "before_latest")

MAX_JSON_PART = TRAINER_STATE_MAX_BYTES
"""trainer_state.json's bound, and optimizer.json's (param groups: smaller still, and read here alone)."""
TOKENIZER_FILES = {TOKENIZER_FILE: TOKENIZER_MAX_BYTES, TOKENIZER_CONFIG: TOKENIZER_CONFIG_MAX_BYTES}
"""The tokenizer files a checkpoint lists when its run had them, with the most of each kept: validated_weights keeps
them as hashed (an export copies them, a loader loads them); one listed over its bound is hashed all the same (the
checkpoint stays valid: init.from and a LoRA base load its weights, not its tokenizer) and not kept
(Validated.over_bound), which an export then refuses to copy."""


def verify_manifest(manifest: dict, size_of: Callable[[str], int | None],
                    sha256_of: Callable[[str], str]) -> list[str]:
    """Problems of a copy against its manifest (empty: good), through callbacks so that the sync can check a
    remote copy: size_of(name) -> size or None if missing; sha256_of(name) is only called when sizes match."""
    return manifest_problems(manifest) or table_problems(manifest["files"], size_of, sha256_of, listed_in=MANIFEST)


def manifest_problems(manifest: Any) -> list[str]:
    if not isinstance(manifest, dict):
        return [f"{MANIFEST} is not a JSON object"]
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        return [f"{MANIFEST}: format {manifest.get('format')!r} version {manifest.get('version')!r}, "
                f"expected {FORMAT!r} version {VERSION}"]
    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(manifest.get("step"), int):
        return [f"{MANIFEST}: needs an integer 'step' and a 'files' table"]
    problems = [f"{MANIFEST}: does not list {name}" for name in REQUIRED_FILES if name not in files]
    return problems + contents.reference_pass_problems(manifest) + file_entry_problems(files, MANIFEST)


# --- validation --------------------------------------------------------------------------------------------------

def read_manifest(ckpt_dir: str | os.PathLike) -> dict:
    """The manifest as parsed JSON (not yet checked: manifest_problems), read as untrusted: a regular file, no link
    followed, size and depth bounded. Raises CheckpointInvalid."""
    return _read_manifest(Path(ckpt_dir))[0]


def saved_pass(ckpt_dir: str | os.PathLike) -> int | None:
    """The pairs of a DPO reference pass a step 0 holds so far (its manifest's REFERENCE_PASS: saved periodically or
    by a stop, trainer/loop/dpo_reference.py); None when it holds none (its sums complete), or cannot be read."""
    try:
        return (contents.reference_pass(read_manifest(ckpt_dir)) or (None,))[0]
    except (CheckpointInvalid, OSError):
        return None


def _read_manifest(ckpt_dir: Path) -> tuple[Any, str]:
    """(read_manifest's answer, the sha256 of the bytes it was parsed from: what init.from's record names)."""
    try:
        raw = read_bytes(ckpt_dir / MANIFEST, max_bytes=MANIFEST_MAX_BYTES)
    except Unreadable as e:
        if e.missing:
            raise CheckpointInvalid(ckpt_dir, f"no {MANIFEST} (an unfinished or partial checkpoint)") from None
        raise CheckpointInvalid(ckpt_dir, f"cannot read {MANIFEST}: {e.why}") from None
    try:
        return loads(raw, expect=None), hashlib.sha256(raw).hexdigest()
    except Unreadable as e:
        raise CheckpointInvalid(ckpt_dir, f"{MANIFEST} is not valid JSON: {e.why}") from None


def validate(ckpt_dir: str | os.PathLike, expected: Expectation | None = None) -> dict:
    """The trainer_state of a checkpoint that is intact and fits `expected`; else raises CheckpointInvalid (the
    checkpoint is damaged) or CheckpointMismatch (it belongs to another model config, tokenizer or corpus).

    Checked: the directory and every file it lists are what they are, not links (lstat); manifest, every file's
    size then sha256, step agreement (name, manifest, trainer_state, optimizer),
    model config and fingerprints against `expected`, keys/shapes/dtypes against the model config, every tensor
    finite. Without `expected` the checkpoint is checked against the config it records itself.

    Its contents are untrusted even when every hash matches (the manifest is as easy to write as the rest): the
    JSON parts are parsed with a depth bound and their types checked (_structure_problems) before they are used,
    so that a malformed checkpoint is CheckpointInvalid, never another exception. A loader of the weights asks
    validated_weights instead: the same checks, and the bytes they were made on."""
    return validate_keeping(Path(ckpt_dir), expected)[0]


@dataclass(frozen=True)
class Validated:
    """A checkpoint as one validation read it, for a loader that must use what was checked and nothing read since
    (whoever can write a checkpoint of another user's, or of a shared remote, can put a consistent manifest and
    other weights in place the moment validation is done)."""

    state: dict
    """trainer_state.json, as validate returns it."""
    manifest_sha256: str
    """The sha256 of the manifest validation read: what init.from's record (init_source.fingerprint) must name."""
    weights: bytes
    """model.safetensors exactly as hashed against that manifest and scanned (header, shapes, dtypes, finite
    values): for safetensors.torch.load, never a path read again. Empty in what without_weights returns."""
    tokenizer: bytes | None
    """tokenizer.json exactly as hashed against that manifest (unparsed: still untrusted); None when the manifest
    does not list one, and then a tokenizer.json in the directory is none of the checkpoint's: the trainer lists
    every file it writes into a checkpoint, and always has."""
    tokenizer_config: bytes | None
    """tokenizer_config.json (a chat corpus's template) exactly as hashed against that manifest (unparsed); None
    when the manifest does not list one, as for `tokenizer`."""
    path: Path
    """The checkpoint directory validated: a caller looks there, not at a path resolved again (LATEST moves on)."""
    over_bound: frozenset[str] = frozenset()
    """The TOKENIZER_FILES the manifest lists over their bound: hashed, not kept (so `tokenizer` or
    `tokenizer_config` is None though listed)."""
    listed: frozenset[str] = frozenset()
    """Every file name the validated manifest lists (a DPO run's checkpoint lists its reference sums)."""

    @property
    def trained_on_conversations(self) -> bool:
        """Whether the run trained on a chat or preference corpus (SFT, DPO): the data format of the corpus it records
        (corpus_meta.corpus_summary), else, for a checkpoint older than that record, its chat template (a text
        corpus's checkpoints never carry one). `minilmd sample` without --chat says --chat of such a model."""
        recorded = self.state.get(CORPUS_SUMMARY)
        data_format = recorded.get("data_format") if isinstance(recorded, dict) else None
        if data_format in ("text", "chat", "dpo"):
            return data_format != "text"
        return self.tokenizer_config is not None

    def without_weights(self) -> Validated:
        """This validation once its weights are loaded: what a loader keeps and hands on (the trainer_state, the
        tokenizer files as hashed) without holding the model's bytes beside its tensors."""
        return replace(self, weights=b"")


def validated_weights(ckpt_dir: str | os.PathLike, expected: Expectation | None = None) -> Validated:
    """validate(ckpt_dir, expected), keeping the weights file's bytes as they were hashed and scanned, and those of
    the tokenizer files the manifest lists (TOKENIZER_FILES): each file is read once, so nothing swapped in after
    its check (a link, another manifest with other weights or another tokenizer, a file grown) is loaded or
    exported. The weights are held in memory whole (a few hundred MB at our model sizes, which the loader needs
    anyway), no more than the size the manifest lists; a tokenizer file listed over its bound is hashed, not kept
    (Validated.over_bound). Raises as validate does."""
    path = Path(ckpt_dir)
    state, manifest, manifest_sha256, scans, kept, _ = validate_keeping(path, expected,
                                                                        keep=(MODEL_FILE, *TOKENIZER_FILES))
    weights = scans[MODEL_FILE].data
    assert isinstance(weights, bytes)  # kept (`keep` names it), as bytes (no `carried`)
    return Validated(state, manifest_sha256, weights, tokenizer=kept.get(TOKENIZER_FILE),
                     tokenizer_config=kept.get(TOKENIZER_CONFIG), path=path,
                     over_bound=frozenset(name for name, data in kept.items() if data is None),
                     listed=frozenset(manifest["files"]))


def validate_keeping(ckpt_dir: Path, expected: Expectation | None, keep: tuple[str, ...] = (),
                     carried: Mapping[str, int] | None = None) -> tuple[dict, dict, str, dict[str, Scan],
                                                                        dict[str, bytes | None], dict]:
    """validate's one read of a checkpoint, with what it read: (trainer_state, the manifest, its sha256, the
    safetensors scans (those `keep` names with their bytes), the bytes of the other files kept (_verify_files,
    `carried` too), optimizer.json). For a loader that must load the very bytes validation checked
    (validated_weights here, checkpoint_load.validated_for_loading). Raises as validate does."""
    _check_directory(ckpt_dir)
    manifest, manifest_sha256 = _read_manifest(ckpt_dir)
    scans, kept = _verify_files(ckpt_dir, manifest, expected, keep, carried)
    json_parts = {name: data for name in JSON_PARTS if (data := kept.pop(name)) is not None}  # all: always kept
    step = manifest["step"]
    state, opt_meta = parse_json_parts(ckpt_dir, json_parts)
    check_recorded(ckpt_dir, state, step, expected, opt_meta)
    shapes = _expected_shapes(ckpt_dir, _model_config(ckpt_dir, state, expected), _lora_config(state, expected))
    problems = contents.tensor_problems(scans, opt_meta, shapes, step) + contents.pass_file_problems(manifest, scans)
    if problems:
        raise CheckpointInvalid(ckpt_dir, problems)
    return state, manifest, manifest_sha256, scans, kept, opt_meta


def check_recorded(ckpt_dir: Path, state: dict, step: int, expected: Expectation | None,
                   opt_meta: dict | None = None) -> None:
    """What validation checks of a checkpoint's trainer_state.json (parsed from bytes its manifest vouches for) and
    optimizer.json: their types, one step (`step`: the manifest's), the model, kernels, corpus and tokenizer it was
    trained with against `expected`. Also what `run --check` and the launch look at of a remote checkpoint without
    fetching its tensors (daemon/jobs/fetch.py peek_latest). Raises CheckpointInvalid or CheckpointMismatch."""
    problems = contents.structure_problems(state, opt_meta or {}) or contents.step_problems(ckpt_dir, step, state)
    if problems:
        raise CheckpointInvalid(ckpt_dir, problems)
    check_expectation(ckpt_dir, state, expected)


JSON_PARTS = (TRAINER_STATE, OPTIMIZER_META)
"""The files validation parses: kept as they are hashed (no more than MAX_JSON_PART), and parsed from those bytes."""


def _verify_files(ckpt_dir: Path, manifest: dict, expected: Expectation | None, keep: tuple[str, ...] = (),
                  carried: Mapping[str, int] | None = None) -> tuple[dict[str, Scan], dict[str, bytes | None]]:
    """Every file against the manifest (sizes, then sha256); the safetensors files are scanned in the same read
    (scan_safetensors: header, dtypes, shapes, non-finite counts). Returns the scans by file name, and the bytes of
    the JSON_PARTS as they were hashed: parsing those, never the path read again, parses what the manifest's hash
    vouches for (a file swapped after its hash is not what is parsed). A file is looked at with lstat and opened
    as minilmd/untrusted.py opens one: a link (even to a regular file: its bytes are another place's), a FIFO
    listed with size 0 (it would block the hash) or /dev/zero is invalid, never read. The safetensors files named
    in `keep` are kept whole in their scan (Scan.data), as hashed; the TOKENIZER_FILES named in it and listed are
    kept beside the JSON parts, as hashed, when listed within their bound (None: listed over it, hashed only). A
    loader's `carried` ({name: the most read}): each refused listed over it, else kept (as bytes); the model's and
    optimizer's kept writable (its tensors are made over them)."""
    scans: dict[str, Scan | ValueError] = {}
    kept: dict[str, bytes | None] = {}
    digests: dict[str, str] = {}

    def size_of(name: str) -> int | None:
        try:
            st = os.lstat(ckpt_dir / name)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointInvalid(ckpt_dir, f"{name} is {file_kind(st.st_mode)}, not a regular file")
        return st.st_size

    def sha256_of(name: str) -> str:
        if name not in digests:  # a JSON part may be hashed first, for a tensors' file read whole (checked_first)
            digests[name] = hashed(name)
        return digests[name]

    def hashed(name: str) -> str:
        try:
            size, most = manifest["files"][name]["size"], (carried or {}).get(name)
            if most is not None and size > most:
                raise CheckpointInvalid(ckpt_dir, f"cannot read {name}: over {size_text(most)}")
            if name.endswith(".safetensors"):
                check = checked_first(name, size) if name in keep and name in (MODEL_FILE, OPTIMIZER_FILE) else None
                whole = name in keep and (check is not None or name not in (MODEL_FILE, OPTIMIZER_FILE))
                try:
                    scan = scan_safetensors(ckpt_dir / name, size=size, keep=whole, check_header=check,
                                            writable=carried is not None and name in (MODEL_FILE, OPTIMIZER_FILE))
                    scans[name] = scan
                    return scan.sha256
                except Unreadable:
                    raise
                except ValueError as e:  # malformed: hashed all the same, so that a damaged copy says so
                    scans[name] = e
            if name in JSON_PARTS or most is not None:
                digest, kept[name] = hashed_bytes(ckpt_dir / name, size, MAX_JSON_PART if most is None else most)
                return digest
            if name in keep and name in TOKENIZER_FILES:
                if size > TOKENIZER_FILES[name]:  # hashed below, not kept: Validated.over_bound
                    kept[name] = None
                else:
                    digest, kept[name] = hashed_bytes(ckpt_dir / name, size, TOKENIZER_FILES[name])
                    return digest
            return sha256_regular(ckpt_dir / name, size=size)
        except Unreadable as e:  # replaced since its lstat, deleted by a concurrent prune, unreadable (EIO)
            raise CheckpointInvalid(ckpt_dir, f"cannot read {name}: {e.why}") from None

    def checked_first(name: str, size: int) -> Callable[[dict], None] | None:
        """Before the model or optimizer file is read whole: the shapes its JSON parts (hashed first) make it need,
        a listed size beyond them refused and its header checked against them (header_problems). None: a JSON
        part not as listed, or not of `expected` (invalid, or a mismatch, later): the file is hashed, not kept."""
        if any(sha256_of(part) != manifest["files"][part]["sha256"] for part in JSON_PARTS):
            return None
        try:
            parts = {part: data for part in JSON_PARTS if (data := kept.get(part)) is not None}  # all: hashed
            state, opt_meta = parse_json_parts(ckpt_dir, parts)
            check_recorded(ckpt_dir, state, manifest["step"], expected, opt_meta)
            shapes = _expected_shapes(ckpt_dir, _model_config(ckpt_dir, state, expected), _lora_config(state, expected))
        except CheckpointError:
            return None
        if size > 8 + MAX_HEADER + contents.most_data_bytes(name, shapes):
            raise CheckpointInvalid(ckpt_dir, f"{name}: listed as {size_text(size)}, more than its shapes need")

        def check_header(found: dict) -> None:
            problems = contents.header_problems(name, found, opt_meta, shapes, manifest["step"])
            if problems:
                raise CheckpointInvalid(ckpt_dir, problems)
        return check_header

    try:
        problems = verify_manifest(manifest, size_of, sha256_of)
    except OSError as e:  # unreadable, or deleted under us by a concurrent prune
        raise CheckpointInvalid(ckpt_dir, f"cannot read {e.filename or 'a file'}: {e.strerror or e}") from None
    if problems:
        raise CheckpointInvalid(ckpt_dir, problems)
    damaged = [str(scan) for scan in scans.values() if isinstance(scan, ValueError)]
    if damaged:  # every damaged safetensors file, not only the first
        raise CheckpointInvalid(ckpt_dir, damaged)
    return {name: scan for name, scan in scans.items() if isinstance(scan, Scan)}, kept


def hashed_bytes(path: Path, size: int, max_bytes: int) -> tuple[str, bytes]:
    """(sha256, the bytes hashed) of a file read once as sha256_regular reads one: its listed `size`, no more than
    max_bytes. Raises Unreadable. A checkpoint file that is both checked against its manifest and used (a JSON part,
    a tokenizer file; checkpoint_load.for_loading's parts) is read so: what is used is what was hashed."""
    kept = io.BytesIO()
    sink = Hashing(keep=kept)
    copy_regular(path, sink, size=size, max_bytes=max_bytes)
    return sink.sha256.hexdigest(), kept.getvalue()


def _check_directory(ckpt_dir: Path) -> None:
    """The checkpoint directory is one itself: a link to one is refused (its files would be another place's, the
    link's target free to change between validation and loading). Missing: read_manifest says so."""
    try:
        mode = os.lstat(ckpt_dir).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise CheckpointInvalid(ckpt_dir, f"cannot be looked at: {e.strerror or e}") from None
    if not stat.S_ISDIR(mode):
        raise CheckpointInvalid(ckpt_dir, f"the checkpoint is {file_kind(mode)}, not a directory")


def parse_json_parts(ckpt_dir: Path, json_parts: dict[str, bytes]) -> tuple[dict, dict]:
    """(trainer_state, optimizer meta) from the bytes of JSON_PARTS as hashed against the manifest (_verify_files',
    checkpoint_load.for_loading's), each a JSON object of bounded depth; their hashes matched, but a manifest can be
    rewritten to match anything. CheckpointInvalid saying which part when one is not."""
    parts = []
    for name in JSON_PARTS:
        try:
            parts.append(loads(json_parts[name], expect=dict))
        except Unreadable as e:
            raise CheckpointInvalid(ckpt_dir, f"{name}: {e.why}") from None
    return parts[0], parts[1]


def _model_config(ckpt_dir: Path, state: dict, expected: Expectation | None) -> dict:
    """The model config the tensors must fit: the run's when given, else the one the checkpoint records."""
    model_cfg = expected.model if expected and expected.model is not None else \
        (state.get("config") or {}).get("model")
    if model_cfg is None:
        raise CheckpointInvalid(ckpt_dir, f"{TRAINER_STATE} records no model config to check shapes against")
    return model_cfg


def _lora_config(state: dict, expected: Expectation | None) -> dict | None:
    """The LoRA config the tensors must fit: the run's when a model is expected, else the checkpoint's own."""
    return expected.lora if expected and expected.model is not None else contents.saved_lora(state)


def _expected_shapes(ckpt_dir: Path, model_cfg: dict, lora_cfg: dict | None) -> dict[str, tuple[int, ...]]:
    try:
        shapes = expected_adapter_shapes(model_cfg, lora_cfg) if lora_cfg else expected_state_shapes(model_cfg)
        return {k: tuple(v) for k, v in shapes.items()}
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
        raise CheckpointInvalid(ckpt_dir, f"{TRAINER_STATE}: model config unusable: {e}") from None
