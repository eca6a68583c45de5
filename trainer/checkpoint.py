"""Checkpoints: written atomically, validated strictly, found again after any crash.

A checkpoint is a directory `step-00001234/` under a root (local scratch, or the remote):

    model.safetensors      fp32 weights; keys and shapes exactly those of model_shapes.expected_state_shapes
    optimizer.safetensors  the optimizer's tensors, flattened as `state.<param index>.<name>`
    optimizer.json         param_groups and the non-tensor parts of the optimizer state (no pickle anywhere)
    trainer_state.json     step, tokens seen, data cursor, RNG states, run config, fingerprints of data/tokenizer
    tokenizer.json         a copy of the run's tokenizer, when the trainer gives one (for sample/export)
    manifest.json          size and sha256 of every other file; written LAST

Protocol of `save`: write into `.tmp-step-XXXXXXXX-<pid>/`, fsync every file, write the manifest, fsync the
directory, rename it to `step-XXXXXXXX/`, fsync the root, then replace `LATEST` atomically. A directory without a
manifest does not exist for any reader here; `LATEST` is for humans and scripts, readers here scan the directories.

Everything but `save`/`load`/`AsyncCheckpointer` is torch-free (json, numpy, plain reads; never mmap, since a
checkpoint on NFS must not be able to kill the reader with SIGBUS): the supervisor validates before it syncs.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import random
import re
import shutil
import signal
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from minilmd.trainer.protocol import atomic_write_text

FORMAT = "minilmd-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_META = "optimizer.json"
TRAINER_STATE = "trainer_state.json"
TOKENIZER_FILE = "tokenizer.json"
REQUIRED_FILES = (MODEL_FILE, OPTIMIZER_FILE, OPTIMIZER_META, TRAINER_STATE)
LATEST = "LATEST"
QUARANTINE = "quarantine"
REASON_FILE = "reason.txt"
TMP_PREFIX = ".tmp-"

# Test-only: "point@step" makes `save` SIGKILL its own process at that point of the protocol for that step, so
# that tests can kill deterministically mid-save. Points: after_model, before_manifest, before_rename, before_latest.
KILL_ENV = "MINILMD_TEST_CHECKPOINT_KILL"
KILL_POINTS = ("after_model", "before_manifest", "before_rename", "before_latest")

_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_TMP_DIR = re.compile(r"^\.tmp-.*-(\d+)$")
_MAX_HEADER = 64 << 20
_READ_CHUNK = 16 << 20
# safetensors dtype name -> (numpy dtype used to read it, is floating point)
_NP_DTYPES = {"F64": ("<f8", True), "F32": ("<f4", True), "F16": ("<f2", True), "BF16": ("<u2", True),
              "I64": ("<i8", False), "I32": ("<i4", False), "I16": ("<i2", False), "I8": ("i1", False),
              "U8": ("u1", False), "BOOL": ("u1", False)}


class CheckpointError(Exception):
    """A checkpoint that cannot be used. `problems` lists every reason found, each naming a file or tensor."""

    def __init__(self, path: str | os.PathLike, problems: list[str] | str):
        self.path = Path(path)
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(f"{self.path}: " + "; ".join(self.problems))


class CheckpointInvalid(CheckpointError):
    """Damaged or incomplete (bad manifest, size, hash, shape, NaN...): set aside and fall back to an older one."""


class CheckpointMismatch(CheckpointError):
    """Intact, but from a different run: model config, tokenizer or data differ. Resuming from it is refused
    (the trainer turns it into a config or data error), never silently replaced by a fresh start.
    `kind` is "model", "tokenizer" or "data" (the first difference found)."""

    def __init__(self, path, problems, kind: str):
        self.kind = kind
        super().__init__(path, problems)


@dataclass
class Expectation:
    """What a checkpoint must match to be resumed by this run. None: not checked."""

    model: dict | None = None
    """The run's ModelSection as a dict (RunConfig.model_dict())."""
    data_fingerprint: str | None = None
    """PreparedCorpus.data_fingerprint of the run's corpus."""
    tokenizer_fingerprint: str | None = None
    """PreparedCorpus.tokenizer_fingerprint (sha256 of tokenizer.json)."""


# --- names ---------------------------------------------------------------------------------------------------------

def step_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of(path: str | os.PathLike) -> int:
    """The step in a checkpoint directory's name (`step-00001234` -> 1234); ValueError for other names."""
    m = _STEP_DIR.match(Path(path).name)
    if not m:
        raise ValueError(f"{path}: not a checkpoint directory name (expected step-XXXXXXXX)")
    return int(m.group(1))


def read_latest(root: str | os.PathLike) -> str | None:
    """The directory name `LATEST` points to, or None when there is none yet."""
    try:
        name = (Path(root) / LATEST).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return name or None


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Step directories holding a manifest, oldest first. Temporary and manifest-less ones do not exist here."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / MANIFEST).is_file()]
    return sorted(found, key=step_of)


# --- hashing and safetensors, torch-free ------------------------------------------------------------------------

def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _parse_safetensors_header(raw8: bytes, read: Callable[[int], bytes], size: int, name: str) -> tuple[dict, int]:
    """(tensor entries sorted by offset, data start). Raises ValueError naming what is wrong."""
    if len(raw8) < 8:
        raise ValueError(f"{name}: shorter than a safetensors header")
    (n,) = struct.unpack("<Q", raw8)
    if n > _MAX_HEADER or 8 + n > size:
        raise ValueError(f"{name}: header length {n} does not fit a {size}-byte file")
    try:
        header = json.loads(read(n))
    except ValueError as e:
        raise ValueError(f"{name}: header is not JSON ({e})") from None
    header.pop("__metadata__", None)
    entries = dict(sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]))
    expected_start = 0
    for key, e in entries.items():
        begin, end = e["data_offsets"]
        if e["dtype"] not in _NP_DTYPES:
            raise ValueError(f"{name}: tensor {key} has unsupported dtype {e['dtype']}")
        itemsize = np.dtype(_NP_DTYPES[e["dtype"]][0]).itemsize
        if begin != expected_start or end - begin != int(np.prod(e["shape"], dtype=np.int64)) * itemsize:
            raise ValueError(f"{name}: tensor {key} has inconsistent offsets {e['data_offsets']}")
        expected_start = end
    if 8 + n + expected_start != size:
        raise ValueError(f"{name}: tensors end at byte {8 + n + expected_start}, file has {size}")
    return entries, 8 + n


def _nonfinite_count(buf: bytes, dtype: str) -> int:
    np_dtype, is_float = _NP_DTYPES[dtype]
    if not is_float:
        return 0
    a = np.frombuffer(buf, dtype=np_dtype)
    if dtype == "BF16":  # numpy has no bfloat16: an all-ones exponent is inf or NaN
        return int(np.count_nonzero((a & 0x7F80) == 0x7F80))
    return int(a.size - np.count_nonzero(np.isfinite(a)))


def scan_safetensors(path: str | os.PathLike) -> tuple[str, dict, dict[str, int], dict[str, float]]:
    """One sequential read of a safetensors file: (sha256, {name: {"dtype", "shape"}}, {name: non-finite count}
    for tensors that have any, {name: value} of one-element tensors). Raises ValueError for a malformed file."""
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256()
    nonfinite: dict[str, int] = {}
    scalars: dict[str, float] = {}
    with open(path, "rb") as f:
        def read(n: int) -> bytes:
            b = f.read(n)
            h.update(b)
            return b

        entries, _ = _parse_safetensors_header(read(8), read, size, path.name)
        for key, e in entries.items():
            begin, end = e["data_offsets"]
            itemsize = np.dtype(_NP_DTYPES[e["dtype"]][0]).itemsize
            remaining, bad = end - begin, 0
            chunk = max(itemsize, _READ_CHUNK // itemsize * itemsize)
            while remaining:
                buf = read(min(chunk, remaining))
                if not buf:
                    raise ValueError(f"{path.name}: ends inside tensor {key}")
                remaining -= len(buf)
                bad += _nonfinite_count(buf, e["dtype"])
                if end - begin == itemsize and e["dtype"] != "BF16":
                    scalars[key] = float(np.frombuffer(buf, dtype=_NP_DTYPES[e["dtype"]][0])[0])
            if bad:
                nonfinite[key] = bad
    shapes = {k: {"dtype": e["dtype"], "shape": tuple(e["shape"])} for k, e in entries.items()}
    return h.hexdigest(), shapes, nonfinite, scalars


def verify_manifest(manifest: dict, size_of: Callable[[str], int | None],
                    sha256_of: Callable[[str], str]) -> list[str]:
    """Problems of a copy against its manifest (empty: good), through callbacks so that [E]'s sync can check a
    remote copy: size_of(name) -> size or None if missing; sha256_of(name) is only called when sizes match."""
    problems = manifest_problems(manifest)
    if problems:
        return problems
    for name, entry in manifest["files"].items():
        size = size_of(name)
        if size is None:
            problems.append(f"{name}: missing (listed in {MANIFEST})")
        elif size != entry["size"]:
            problems.append(f"{name}: size {size} bytes, {MANIFEST} says {entry['size']} (truncated or changed)")
    if problems:
        return problems
    for name, entry in manifest["files"].items():
        digest = sha256_of(name)
        if digest != entry["sha256"]:
            problems.append(f"{name}: sha256 mismatch ({MANIFEST} says {entry['sha256'][:16]}..., "
                            f"file has {digest[:16]}...)")
    return problems


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
    for name, entry in files.items():
        if "/" in name or name in ("", ".", "..") or not isinstance(entry, dict) \
                or not isinstance(entry.get("size"), int) or not isinstance(entry.get("sha256"), str):
            problems.append(f"{MANIFEST}: bad entry for {name!r}")
    return problems


# --- validation --------------------------------------------------------------------------------------------------

def read_manifest(ckpt_dir: str | os.PathLike) -> dict:
    ckpt_dir = Path(ckpt_dir)
    try:
        text = (ckpt_dir / MANIFEST).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointInvalid(ckpt_dir, f"no {MANIFEST} (an unfinished or partial checkpoint)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointInvalid(ckpt_dir, f"cannot read {MANIFEST}: {e}") from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise CheckpointInvalid(ckpt_dir, f"{MANIFEST} is not valid JSON: {e}") from None


def validate(ckpt_dir: str | os.PathLike, expected: Expectation | None = None) -> dict:
    """The trainer_state of a checkpoint that is intact and fits `expected`; else raises CheckpointInvalid (the
    checkpoint is damaged) or CheckpointMismatch (it belongs to another model config, tokenizer or corpus).

    Checked: manifest, every file's size then sha256, step agreement (name, manifest, trainer_state, optimizer),
    model config and fingerprints against `expected`, keys/shapes/dtypes against the model config, every tensor
    finite. Without `expected` the checkpoint is checked against the config it records itself."""
    ckpt_dir = Path(ckpt_dir)
    manifest = read_manifest(ckpt_dir)
    scans: dict[str, tuple] = {}

    def size_of(name: str) -> int | None:
        try:
            return (ckpt_dir / name).stat().st_size
        except FileNotFoundError:
            return None

    def sha256_of(name: str) -> str:
        if name.endswith(".safetensors"):
            try:
                scans[name] = scan_safetensors(ckpt_dir / name)
                return scans[name][0]
            except ValueError as e:
                scans[name] = e
        return sha256_file(ckpt_dir / name)

    problems = verify_manifest(manifest, size_of, sha256_of)
    if problems:
        raise CheckpointInvalid(ckpt_dir, problems)
    for name, scan in scans.items():
        if isinstance(scan, ValueError):
            raise CheckpointInvalid(ckpt_dir, str(scan))

    step = manifest["step"]
    try:
        state = json.loads((ckpt_dir / TRAINER_STATE).read_text(encoding="utf-8"))
        opt_meta = json.loads((ckpt_dir / OPTIMIZER_META).read_text(encoding="utf-8"))
    except ValueError as e:
        raise CheckpointInvalid(ckpt_dir, f"unreadable JSON despite a matching hash: {e}") from None
    if _STEP_DIR.match(ckpt_dir.name) and step_of(ckpt_dir) != step:
        problems.append(f"directory name says step {step_of(ckpt_dir)}, {MANIFEST} says {step}")
    if state.get("step") != step:
        problems.append(f"{TRAINER_STATE} says step {state.get('step')!r}, {MANIFEST} says {step}")
    if problems:
        raise CheckpointInvalid(ckpt_dir, problems)

    _check_expectation(ckpt_dir, state, expected)
    model_cfg = expected.model if expected and expected.model is not None else \
        (state.get("config") or {}).get("model")
    if model_cfg is None:
        raise CheckpointInvalid(ckpt_dir, f"{TRAINER_STATE} records no model config to check shapes against")
    expected_shapes = _expected_shapes(ckpt_dir, model_cfg)
    problems += _shape_problems(MODEL_FILE, scans[MODEL_FILE][1], expected_shapes)
    problems += _optimizer_problems(scans[OPTIMIZER_FILE], opt_meta, expected_shapes, step)
    for name in (MODEL_FILE, OPTIMIZER_FILE):
        for key, n in scans[name][2].items():
            problems.append(f"{name}: tensor {key} has {n} non-finite value(s) (NaN or inf)")
    if problems:
        raise CheckpointInvalid(ckpt_dir, problems)
    return state


def _expected_shapes(ckpt_dir: Path, model_cfg: dict) -> dict[str, tuple[int, ...]]:
    from minilmd.trainer.model_shapes import expected_state_shapes

    try:
        return {k: tuple(v) for k, v in expected_state_shapes(model_cfg).items()}
    except (ValueError, TypeError) as e:
        raise CheckpointInvalid(ckpt_dir, f"{TRAINER_STATE}: model config unusable: {e}") from None


def _check_expectation(ckpt_dir: Path, state: dict, expected: Expectation | None) -> None:
    if expected is None:
        return
    if expected.model is not None:
        saved = (state.get("config") or {}).get("model") or {}
        diff = [f"model.{k}: checkpoint {saved.get(k)!r}, run {expected.model.get(k)!r}"
                for k in sorted(set(saved) | set(expected.model)) if saved.get(k) != expected.model.get(k)]
        if diff:
            raise CheckpointMismatch(ckpt_dir, ["saved by a different model config: " + ", ".join(diff)], "model")
    prints = state.get("fingerprints") or {}
    for kind, want in (("tokenizer", expected.tokenizer_fingerprint), ("data", expected.data_fingerprint)):
        if want is not None and prints.get(kind) != want:
            raise CheckpointMismatch(ckpt_dir, [f"{kind} fingerprint differs: checkpoint {prints.get(kind)!r}, "
                                                f"run {want!r} (a different {kind} than this run uses)"], kind)


def _shape_problems(file: str, found: dict, expected: dict[str, tuple[int, ...]]) -> list[str]:
    problems = [f"{file}: missing tensor {k} {list(s)}" for k, s in expected.items() if k not in found]
    problems += [f"{file}: unexpected tensor {k} {list(found[k]['shape'])}" for k in found if k not in expected]
    for k, s in expected.items():
        if k in found and found[k]["shape"] != s:
            problems.append(f"{file}: tensor {k} has shape {list(found[k]['shape'])}, the config needs {list(s)}")
        elif k in found and found[k]["dtype"] != "F32":
            problems.append(f"{file}: tensor {k} is {found[k]['dtype']}, checkpoints hold F32")
    return problems


def _optimizer_problems(scan: tuple, meta: dict, expected: dict[str, tuple[int, ...]], step: int) -> list[str]:
    _, found, _, scalars = scan
    per_param: dict[int, dict[str, tuple]] = {}
    for key, e in found.items():
        parts = key.split(".", 2)
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
            return [f"{OPTIMIZER_FILE}: unexpected tensor name {key!r} (expected state.<index>.<name>)"]
        per_param.setdefault(int(parts[1]), {})[parts[2]] = e["shape"]
    groups = meta.get("param_groups") or []
    indices = [i for g in groups for i in g.get("params", [])]
    problems = []
    if per_param and sorted(per_param) != sorted(indices):
        problems.append(f"{OPTIMIZER_FILE}: state for parameters {sorted(per_param)[:8]}..., param_groups "
                        f"list {len(indices)} parameters")
    names = meta.get("param_names")
    for idx, tensors in sorted(per_param.items()):
        if names and idx < len(names) and names[idx] in expected:
            want = expected[names[idx]]
            label = names[idx]
        else:
            want, label = None, f"parameter {idx}"
        for tname, shape in tensors.items():
            if tname == "step":
                continue
            if want is not None and shape != want:
                problems.append(f"{OPTIMIZER_FILE}: {tname} of {label} has shape {list(shape)}, needs {list(want)}")
            elif want is None and shape not in expected.values():
                problems.append(f"{OPTIMIZER_FILE}: {tname} of {label} has shape {list(shape)}, no model tensor has")
    steps = {key: v for key, v in scalars.items() if key.endswith(".step")}
    steps.update({f"state.{i}.step": v for i, d in (meta.get("scalars") or {}).items() for k, v in d.items()
                  if k == "step"})
    wrong = {k: v for k, v in steps.items() if v != step}
    if wrong:
        k, v = next(iter(wrong.items()))
        problems.append(f"{OPTIMIZER_FILE}: optimizer step {v:g} ({k}, {len(wrong)} tensor(s)) disagrees with "
                        f"checkpoint step {step}")
    return problems


def verify_report(path: str | os.PathLike, expected: Expectation | None = None) -> dict:
    """`minilmd verify`: validate one checkpoint, or every step directory under a root (those without a
    manifest included, as failures). Nothing is moved. {"ok": bool, "checkpoints": [{"path", "step", "ok",
    "problems", "mismatch"}]}; ok is False when there is no checkpoint at all."""
    path = Path(path)
    if (path / MANIFEST).exists() or _STEP_DIR.match(path.name):
        dirs = [path]
    elif path.is_dir():
        dirs = sorted((p for p in path.iterdir() if _STEP_DIR.match(p.name) and p.is_dir()), key=step_of)
    else:
        dirs = []
    results = []
    for d in dirs:
        entry = {"path": str(d), "step": step_of(d) if _STEP_DIR.match(d.name) else None, "ok": True,
                 "problems": [], "mismatch": None}
        try:
            state = validate(d, expected)
            entry["step"] = state["step"]
        except CheckpointError as e:
            entry.update(ok=False, problems=e.problems,
                         mismatch=e.kind if isinstance(e, CheckpointMismatch) else None)
        results.append(entry)
    if not results:
        results.append({"path": str(path), "step": None, "ok": False, "mismatch": None,
                        "problems": [f"no checkpoint at {path} (neither a step-XXXXXXXX directory nor a root "
                                     f"holding any)"]})
    root = path.parent if dirs == [path] else path
    return {"ok": all(r["ok"] for r in results), "latest": read_latest(root), "checkpoints": results}


def expectation_from_config(config_path: str | os.PathLike, log: Callable[[str], None] = print) -> Expectation:
    """What a run config expects of its checkpoints: its model section and, when its prepared corpus can be
    read, the fingerprints of that corpus's data and tokenizer."""
    from minilmd.trainer.config import load_config

    cfg = load_config(config_path, check_paths=False)
    expected = Expectation(model=cfg.model_dict())
    try:
        from minilmd.trainer.tokenstream import data_fingerprint, read_meta

        meta = read_meta(cfg.data.prepared)
        expected.data_fingerprint = data_fingerprint(meta)
        expected.tokenizer_fingerprint = meta["tokenizer_sha256"]
    except Exception as e:  # the corpus may be staged elsewhere or gone: check what can be checked
        log(f"note: fingerprints not checked, cannot read data.prepared = {cfg.data.prepared!r}: {e}")
    return expected


# --- finding, quarantining, pruning ------------------------------------------------------------------------------

def quarantine(ckpt_dir: str | os.PathLike, reason: str) -> Path:
    """Move a bad checkpoint aside to <root>/quarantine/<name>-<time>/ with a reason.txt; nothing is deleted."""
    ckpt_dir = Path(ckpt_dir)
    qdir = ckpt_dir.parent / QUARANTINE
    qdir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    dest = qdir / f"{ckpt_dir.name}-{stamp}"
    n = 1
    while dest.exists():
        n += 1
        dest = qdir / f"{ckpt_dir.name}-{stamp}-{n}"
    os.rename(ckpt_dir, dest)
    (dest / REASON_FILE).write_text(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {reason}\n", encoding="utf-8")
    return dest


def find_latest(roots: Iterable[str | os.PathLike], expected: Expectation | None = None,
                log: Callable[[str], None] = print) -> Path | None:
    """The newest checkpoint that validates, across roots (on equal steps the earlier root, local, wins).

    One that is damaged is logged with its reason, quarantined, and the next older is tried. One that belongs
    to a different model config, tokenizer or corpus raises CheckpointMismatch: resuming is refused, not
    replaced by an older checkpoint or a fresh start. None when no root holds a valid checkpoint."""
    candidates = [(step_of(p), i, p) for i, root in enumerate(roots) for p in list_checkpoints(root)]
    for _, _, path in sorted(candidates, key=lambda c: (-c[0], c[1])):
        try:
            validate(path, expected)
            return path
        except CheckpointInvalid as e:
            dest = quarantine(path, "; ".join(e.problems))
            log(f"checkpoint {path} is invalid: {'; '.join(e.problems)} -- moved to {dest}, trying an older one")
    return None


_valid_cache: dict[tuple, bool] = {}


def _is_valid_cached(path: Path) -> tuple[bool, str]:
    """Validation for pruning, remembered per manifest identity so that each checkpoint is read once."""
    try:
        st = (path / MANIFEST).stat()
    except FileNotFoundError:
        return False, f"no {MANIFEST}"
    key = (str(path.resolve()), st.st_ino, st.st_mtime_ns, st.st_size)
    if key in _valid_cache:
        return True, ""
    try:
        validate(path)
    except CheckpointError as e:
        return False, "; ".join(e.problems)
    _valid_cache[key] = True
    return True, ""


def prune(root: str | os.PathLike, keep: int, protect: Iterable[str | os.PathLike] = (),
          log: Callable[[str], None] = print) -> list[Path]:
    """Keep the newest `keep` (at least 1) valid checkpoints; delete the older ones, except `protect`ed ones.

    Walks newest first; a damaged checkpoint met before `keep` valid ones were found is quarantined and does not
    count. So the newest valid checkpoint is never deleted. Returns the deleted directories."""
    root = Path(root)
    protected = {Path(p).resolve() for p in protect}
    keep = max(1, keep)
    kept, deleted = 0, []
    for path in reversed(list_checkpoints(root)):
        if kept < keep:
            ok, reason = _is_valid_cached(path)
            if ok:
                kept += 1
            else:
                dest = quarantine(path, reason)
                log(f"checkpoint {path} is invalid: {reason} -- moved to {dest}")
            continue
        if path.resolve() in protected:
            continue
        # Rename first: readers never see a half-deleted directory with its manifest still in place.
        doomed = root / f"{TMP_PREFIX}deleting-{path.name}-{os.getpid()}"
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        deleted.append(path)
    return deleted


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_tmp(root: str | os.PathLike) -> list[Path]:
    """Remove `.tmp-*` directories left by a writer that died (its pid is gone, or is this process). Returns
    them. A temp directory of another live process is left alone: only one trainer writes a root at a time."""
    root = Path(root)
    if not root.is_dir():
        return []
    removed = []
    for p in root.iterdir():
        m = _TMP_DIR.match(p.name)
        if not m or not p.is_dir():
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or not _pid_alive(pid):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


# --- writing (torch) ---------------------------------------------------------------------------------------------

def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes(path: Path, data: bytes) -> dict:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


_TORCH_TO_ST = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def _write_safetensors(path: Path, tensors: dict) -> dict:
    """Stream tensors into a safetensors file, hashing as it writes: one pass, no second read, no full copy."""
    import torch

    header, offset, items = {}, 0, []
    for name in sorted(tensors):
        t = tensors[name].detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": _TORCH_TO_ST[str(t.dtype).removeprefix("torch.")], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        items.append(t)
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for chunk in (struct.pack("<Q", len(hb)), hb):
            f.write(chunk)
            h.update(chunk)
        for t in items:
            if t.numel():
                buf = memoryview(t.reshape(-1).view(dtype=torch.uint8).numpy())
                f.write(buf)
                h.update(buf)
        f.flush()
        os.fsync(f.fileno())
    return {"size": 8 + len(hb) + offset, "sha256": h.hexdigest()}


def _flatten_optimizer(optimizer_state: dict) -> tuple[dict, dict]:
    """torch optimizer state_dict -> ({"state.<i>.<name>": tensor}, JSON-able rest)."""
    import torch

    tensors, scalars = {}, {}
    for idx, entry in optimizer_state.get("state", {}).items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{int(idx)}.{name}"] = value
            else:
                scalars.setdefault(str(int(idx)), {})[name] = value
    groups, tuple_keys = [], []
    for g in optimizer_state.get("param_groups", []):
        groups.append({k: list(v) if isinstance(v, tuple) else v for k, v in g.items()})
        tuple_keys.append(sorted(k for k, v in g.items() if isinstance(v, tuple)))
    return tensors, {"param_groups": groups, "tuple_keys": tuple_keys, "scalars": scalars}


def _maybe_kill(point: str, step: int) -> None:
    if os.environ.get(KILL_ENV) == f"{point}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def save(root: str | os.PathLike, step: int, model_state: dict, optimizer_state: dict, trainer_state: dict, *,
         tokenizer: str | os.PathLike | None = None, param_names: list[str] | None = None) -> Path:
    """Write checkpoint `step` under `root` with the full atomic protocol; returns its directory.

    `model_state` holds exactly the tensors of model_shapes.expected_state_shapes (fp32, on any device);
    `optimizer_state` is optimizer.state_dict(); `trainer_state` is JSON-able (its "step", if any, must be
    `step`); `tokenizer` a tokenizer.json to copy in; `param_names[i]` the name of optimizer parameter i."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if "step" in trainer_state and trainer_state["step"] != step:
        raise ValueError(f"trainer_state step {trainer_state['step']} != checkpoint step {step}")
    final = root / step_name(step)
    tmp = root / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    files = {MODEL_FILE: _write_safetensors(tmp / MODEL_FILE, model_state)}
    _maybe_kill("after_model", step)
    opt_tensors, opt_meta = _flatten_optimizer(optimizer_state)
    opt_meta["param_names"] = list(param_names) if param_names else None
    files[OPTIMIZER_FILE] = _write_safetensors(tmp / OPTIMIZER_FILE, opt_tensors)
    files[OPTIMIZER_META] = _write_bytes(tmp / OPTIMIZER_META, json.dumps(opt_meta, indent=1).encode())
    state = {**trainer_state, "step": step}
    files[TRAINER_STATE] = _write_bytes(tmp / TRAINER_STATE, json.dumps(state, indent=2, sort_keys=True).encode())
    if tokenizer is not None:
        files[TOKENIZER_FILE] = _write_bytes(tmp / TOKENIZER_FILE, Path(tokenizer).read_bytes())
    _maybe_kill("before_manifest", step)
    manifest = {"format": FORMAT, "version": VERSION, "step": step, "created": time.time(), "files": files}
    _write_bytes(tmp / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    _fsync_dir(tmp)
    _maybe_kill("before_rename", step)
    if final.exists():  # a leftover without a valid manifest (a valid one would have been resumed from)
        os.rename(final, root / f"{TMP_PREFIX}replaced-{final.name}-{os.getpid()}")
        shutil.rmtree(root / f"{TMP_PREFIX}replaced-{final.name}-{os.getpid()}", ignore_errors=True)
    os.rename(tmp, final)
    _fsync_dir(root)
    _maybe_kill("before_latest", step)
    atomic_write_text(root / LATEST, final.name + "\n")
    _fsync_dir(root)
    return final


# --- reading (torch) ---------------------------------------------------------------------------------------------

def load(ckpt_dir: str | os.PathLike, device: str = "cpu") -> tuple[dict, dict, dict]:
    """(model_state, optimizer_state, trainer_state) of a checkpoint; validate it first (find_latest does).
    No pickle: tensors come from safetensors, the rest from JSON."""
    from safetensors.torch import load_file

    ckpt_dir = Path(ckpt_dir)
    read_manifest(ckpt_dir)
    model_state = load_file(ckpt_dir / MODEL_FILE, device=device)
    meta = json.loads((ckpt_dir / OPTIMIZER_META).read_text(encoding="utf-8"))
    state: dict[int, dict] = {}
    for key, t in load_file(ckpt_dir / OPTIMIZER_FILE, device=device).items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = t
    for idx, values in (meta.get("scalars") or {}).items():
        state.setdefault(int(idx), {}).update(values)
    groups = [{k: tuple(v) if k in tkeys else v for k, v in g.items()}
              for g, tkeys in zip(meta["param_groups"], meta["tuple_keys"])]
    optimizer_state = {"state": dict(sorted(state.items())), "param_groups": groups}
    trainer_state = json.loads((ckpt_dir / TRAINER_STATE).read_text(encoding="utf-8"))
    return model_state, optimizer_state, trainer_state


# --- RNG states as JSON, so that trainer_state.json stays pickle-free ---------------------------------------------

def capture_rng() -> dict:
    """Python, NumPy, torch (and CUDA, if initialised) RNG states in a JSON-able dict."""
    import torch

    version, mt, gauss = random.getstate()
    np_state = np.random.get_state()
    out = {"python": [version, list(mt), gauss],
           "numpy": [np_state[0], np_state[1].tolist(), *[x.item() if hasattr(x, "item") else x
                                                          for x in np_state[2:]]],
           "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(state: dict) -> None:
    import torch

    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)
                                      for s in state["cuda"]])


# --- saving without stalling the training loop -------------------------------------------------------------------

def _copy_to_cpu(t, buffers: dict | None, key: str):
    """A CPU copy of `t`; with `buffers`, into the same (pinned, for CUDA) buffer as last time: a fresh 768 MB
    allocation costs page faults on every save, a reused one only the copy."""
    import torch

    t = t.detach()
    if buffers is None:
        return t.to("cpu", copy=True)
    buf = buffers.get(key)
    if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
        buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
        buffers[key] = buf
    buf.copy_(t, non_blocking=t.device.type == "cuda")
    return buf


def snapshot_model(model, buffers: dict | None = None) -> dict:
    """A CPU copy of the model's state dict, which the loop may then go on changing. Pass the bare model, not a
    DDP or torch.compile wrapper (their state_dict keys carry a prefix)."""
    return {k: _copy_to_cpu(v, buffers, "model." + k) for k, v in model.state_dict().items()}


def snapshot_optimizer(optimizer, buffers: dict | None = None) -> dict:
    import torch

    sd = optimizer.state_dict()
    state = {i: {k: _copy_to_cpu(v, buffers, f"opt.{i}.{k}") if isinstance(v, torch.Tensor) else v
                 for k, v in s.items()} for i, s in sd["state"].items()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the non-blocking copies into pinned buffers must land before the writer reads
    return {"state": state, "param_groups": copy.deepcopy(sd["param_groups"])}


def optimizer_param_names(model, optimizer) -> list[str]:
    """Name of each optimizer parameter index, in state_dict order (tied parameters under their first name)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names.get(id(p), f"?{i}") for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])]


class AsyncCheckpointer:
    """Saves in a background thread after a CPU snapshot: the loop blocks only for the copy.

    At most one save is in flight; a second `save` first waits for the previous one. After each save the root is
    pruned to `keep` valid checkpoints. `wait()` before exiting (and it re-raises a failure of the writer)."""

    def __init__(self, root: str | os.PathLike, keep: int, tokenizer: str | os.PathLike | None = None,
                 background: bool = True, log: Callable[[str], None] = print):
        self.root, self.keep, self.tokenizer, self.background, self.log = Path(root), keep, tokenizer, background, log
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict = {}  # CPU snapshot buffers, reused from one save to the next (one save in flight)
        self.last_path: Path | None = None
        self.last_write_s: float = 0.0

    def save(self, step: int, model, optimizer, trainer_state: dict) -> float:
        """Snapshot now, write in the background. Returns the seconds the caller was blocked."""
        self.wait()
        t0 = time.perf_counter()
        args = (step, snapshot_model(model, self._buffers), snapshot_optimizer(optimizer, self._buffers),
                copy.deepcopy(trainer_state),
                optimizer_param_names(model, optimizer))
        if self.background:
            self._thread = threading.Thread(target=self._write, args=args, name=f"checkpoint-{step}")
            self._thread.start()
        else:
            self._write(*args)
            self.wait()
        return time.perf_counter() - t0

    def _write(self, step, model_state, optimizer_state, trainer_state, param_names) -> None:
        t0 = time.perf_counter()
        try:
            self.last_path = save(self.root, step, model_state, optimizer_state, trainer_state,
                                  tokenizer=self.tokenizer, param_names=param_names)
            prune(self.root, self.keep, log=self.log)
        except BaseException as e:  # handed to the loop by wait()
            self._error = e
        self.last_write_s = time.perf_counter() - t0

    def wait(self) -> Path | None:
        """Block until the save in flight is on disk; raise its error if it failed. Returns its path."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return self.last_path
