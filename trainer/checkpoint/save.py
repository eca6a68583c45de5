"""The writing half of checkpoints (torch): `save` with the atomic protocol, `load`, RNG states as JSON, CPU
snapshots and the background `AsyncCheckpointer`.

The format, its strict validation, find_latest and prune are torch-free and live in `minilmd.checkpoint`, which
the supervisor imports; nothing there imports this module.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import random
import shutil
import signal
import struct
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from minilmd import procs
from minilmd.checkpoint import FORMAT, VERSION
from minilmd.checkpoint_load import ForLoading, for_loading
from minilmd.checkpoint_pin import Pinned, ScratchGone, pin_root
from minilmd.checkpoint_select import prune
from minilmd.dirfd import Replaced
from minilmd.fsio import atomic_write_text, fsync_dir, inodes_if_none_left, is_disk_full, publish_dir
from minilmd.names import (
    CHECKPOINT_KILL_ENV,
    LATEST,
    MANIFEST,
    MODEL_FILE,
    OPTIMIZER_FILE,
    OPTIMIZER_META,
    TOKENIZER_CONFIG,
    TOKENIZER_CONFIG_MAX_BYTES,
    TOKENIZER_FILE,
    TOKENIZER_MAX_BYTES,
    TRAINER_STATE,
    step_name,
)
from minilmd.plan.trainer_state import STEP
from minilmd.proc_info import this_process
from minilmd.tmpnames import save_tmp_name
from minilmd.untrusted import Unreadable, read_bytes

# --- writing (torch) ---------------------------------------------------------------------------------------------

SAVE_SLACK = 128 * 1024
"""Counted beyond the tensors and the tokenizer: the JSON files (a chat template's tokenizer_config.json too),
the safetensors headers, a page per file."""


class ScratchFull(Exception):
    """A checkpoint does not fit where it is saved: `needs` bytes, `free` bytes free there. Nothing of it is left
    behind, so the space another job holds is not taken too; the supervisor makes room or waits (fault.json)."""

    def __init__(self, root: Path, step: int, needs: int, free: int):
        self.root, self.step, self.needs, self.free = root, step, needs, free
        inodes = inodes_if_none_left(root)  # its ENOSPC with bytes to spare: "has N MB free" would contradict it
        room = f"which has no inode left for a new file ({inodes:,} in all)" if inodes is not None else \
            f"which has {free / 1e6:,.1f} MB free"
        super().__init__(f"scratch full: checkpoint {step_name(step)} needs {needs / 1e6:,.1f} MB in {root}, "
                         f"{room} (No space left on device)")


def _free_bytes(root: Path) -> int:
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize


def _bytes_needed(tensor_dicts: list[dict], tokenizer: dict[str, bytes]) -> int:
    tensors = sum(t.numel() * t.element_size() for d in tensor_dicts for t in d.values())
    return tensors + sum(map(len, tokenizer.values())) + SAVE_SLACK


Tokenizer = str | os.PathLike | Mapping[str, bytes] | None
"""What a checkpoint carries of the tokenizer: {file name: bytes} as its corpus read them once (PreparedCorpus
.tokenizer_files, checked against meta.json's tokenizer_sha256), or a tokenizer.json's path (tests, tools: read
here once, with a tokenizer_config.json beside it), or None."""


def tokenizer_files(tokenizer: Tokenizer) -> dict[str, bytes]:
    """{TOKENIZER_FILE: bytes, TOKENIZER_CONFIG: bytes (a chat template, when there is one)}. A path is read as
    untrusted (bounded, no link followed, no FIFO opened): ValueError (Unreadable) for anything else."""
    if tokenizer is None:
        return {}
    if isinstance(tokenizer, Mapping):
        return dict(tokenizer)
    path = Path(tokenizer)
    files = {TOKENIZER_FILE: read_bytes(path, max_bytes=TOKENIZER_MAX_BYTES)}
    try:  # a chat corpus's template: for sample --chat, export
        files[TOKENIZER_CONFIG] = read_bytes(path.with_name(TOKENIZER_CONFIG), max_bytes=TOKENIZER_CONFIG_MAX_BYTES)
    except Unreadable as e:
        if not e.missing:
            raise
    return files



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

    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict] = {}
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
    if os.environ.get(CHECKPOINT_KILL_ENV) == f"{point}@{step}":
        procs.signal_self(signal.SIGKILL)


def save(root: str | os.PathLike, step: int, model_state: dict, optimizer_state: dict, trainer_state: dict, *,
         tokenizer: Tokenizer = None, param_names: list[str] | None = None,
         extra: dict[str, bytes] | None = None, notes: dict | None = None, pinned: Pinned | None = None) -> Path:
    """Write checkpoint `step` under `root` with the full atomic protocol; returns its directory.

    `model_state` holds exactly the tensors of model_shapes.expected_state_shapes (fp32, on any device);
    `optimizer_state` is optimizer.state_dict(); `trainer_state` is JSON-able (its "step", if any, must be
    `step`); `tokenizer` the tokenizer's files to write in (Tokenizer); `param_names[i]` the name of optimizer
    parameter i; `extra` more files by name (a DPO run's reference sums: trainer/loop/dpo_reference.py), listed and
    hashed as the rest; `notes` more keys of the manifest (a stopped DPO reference pass's REFERENCE_PASS).
    ScratchFull when it does not fit: checked up front, and on ENOSPC/EDQUOT while writing (the half is removed).
    `pinned` (the trainer's root, AsyncCheckpointer's pin_root): nothing is made, ScratchGone when it is not that
    directory any more; without it (a tool's or a test's root of its own) the root is made with its parents."""
    root = Path(root)
    if pinned is not None:
        _still_there(pinned, step)
    else:
        root.mkdir(parents=True, exist_ok=True)
    if STEP in trainer_state and trainer_state[STEP] != step:
        raise ValueError(f"trainer_state step {trainer_state[STEP]} != checkpoint step {step}")
    final = root / step_name(step)
    tmp = root / save_tmp_name(step, *this_process())
    if tmp.exists():
        shutil.rmtree(tmp)
    opt_tensors, opt_meta = _flatten_optimizer(optimizer_state)
    opt_meta["param_names"] = list(param_names) if param_names else None
    extra = extra or {}
    tokenizer = tokenizer_files(tokenizer)
    needs = _bytes_needed([model_state, opt_tensors], tokenizer) + sum(map(len, extra.values()))
    if _free_bytes(root) < needs:  # refused up front: filling the disk to the last byte harms its other users
        raise ScratchFull(root, step, needs, _free_bytes(root))
    try:
        _write_checkpoint(root, tmp, final, step, model_state, opt_tensors, opt_meta, trainer_state, tokenizer,
                          extra, notes or {})
    except (OSError, Replaced) as e:
        # removed while written: ENOENT, or the publish's look at its temporary directory by name finding none
        # (Replaced), when the removal came between the last write and the rename
        if pinned is not None and (why := pinned.gone()) is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ScratchGone(root, step, why) from e
        if isinstance(e, Replaced) or not is_disk_full(e):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise ScratchFull(root, step, needs, _free_bytes(root)) from e
    return final


def _still_there(pinned: Pinned, step: int) -> None:
    if (why := pinned.gone()) is not None:
        raise ScratchGone(pinned.root, step, why)


def _write_checkpoint(root: Path, tmp: Path, final: Path, step: int, model_state: dict, opt_tensors: dict,
                      opt_meta: dict, trainer_state: dict, tokenizer: dict[str, bytes],
                      extra: dict[str, bytes], notes: dict) -> None:
    tmp.mkdir()
    files = {MODEL_FILE: _write_safetensors(tmp / MODEL_FILE, model_state)}
    _maybe_kill("after_model", step)
    files[OPTIMIZER_FILE] = _write_safetensors(tmp / OPTIMIZER_FILE, opt_tensors)
    files[OPTIMIZER_META] = _write_bytes(tmp / OPTIMIZER_META, json.dumps(opt_meta, indent=1).encode())
    state = {**trainer_state, STEP: step}  # the one writer of the step (the parts write the rest)
    files[TRAINER_STATE] = _write_bytes(tmp / TRAINER_STATE, json.dumps(state, indent=2, sort_keys=True).encode())
    for name, data in (*tokenizer.items(), *extra.items()):
        files[name] = _write_bytes(tmp / name, data)
    _maybe_kill("before_manifest", step)
    manifest = {**notes, "format": FORMAT, "version": VERSION, "step": step, "created": time.time(), "files": files}
    _write_bytes(tmp / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    _maybe_kill("before_rename", step)
    # An existing `final` is a leftover without a valid manifest (a valid one would have been resumed from).
    publish_dir(tmp, final)
    _maybe_kill("before_latest", step)
    atomic_write_text(root / LATEST, final.name + "\n")
    fsync_dir(root)


def mark_best(root: str | os.PathLike, name: str) -> None:
    """Point BEST at a published checkpoint (atomically, like LATEST)."""
    from minilmd.names import BEST

    atomic_write_text(Path(root) / BEST, name + "\n")
    fsync_dir(Path(root))


# --- reading (torch) ---------------------------------------------------------------------------------------------

def load(ckpt_dir: str | os.PathLike, device: str = "cpu") -> tuple[dict, dict, dict]:
    """(model_state, optimizer_state, trainer_state) of a checkpoint; validate it first (find_latest does).
    No pickle: tensors come from safetensors, the rest from JSON."""
    model_state, optimizer_state, trainer_state, _ = load_carrying(ckpt_dir, {}, device)
    return model_state, optimizer_state, trainer_state


def load_carrying(ckpt_dir: str | os.PathLike, carried: Mapping[str, int],
                  device: str = "cpu") -> tuple[dict, dict, dict, dict[str, bytes]]:
    """load's three parts, and the files of `carried` ({name: the most read}) the checkpoint lists, by name. Every
    file is read once and checked against one reading of the manifest (checkpoint_load.for_loading: the JSON parts no
    more than MAX_JSON_PART), and what is loaded is made of those very bytes, never from a path read again: the
    tensors are views of the buffers the files were read into (held_tensors), so the load holds the tensors' files
    once, their size, as the tensors themselves would. Raises CheckpointInvalid."""
    return loaded(for_loading(ckpt_dir, carried), device)


def loaded(parts: ForLoading, device: str = "cpu") -> tuple[dict, dict, dict, dict[str, bytes]]:
    """load_carrying's answer made of a checkpoint's parts as one read checked them (checkpoint_load.for_loading, or a
    resume's checkpoint_load.validated_for_loading): the tensors views of the buffers the files were read into."""
    from minilmd.trainer.checkpoint.held_tensors import tensors_of

    model_state = _on(tensors_of(parts.model), device)
    optimizer_state = optimizer_state_of(_on(tensors_of(parts.optimizer), device), parts.opt_meta)
    return model_state, optimizer_state, parts.state, parts.carried


def optimizer_state_of(tensors: dict, meta: dict) -> dict:
    """The optimizer's state_dict from optimizer.safetensors' tensors ("state.IDX.NAME") and optimizer.json (its
    scalars, param groups and which of their values were tuples): what `save` split, put together again."""
    state: dict[int, dict] = {}
    for key, t in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = t
    for idx, values in (meta.get("scalars") or {}).items():
        state.setdefault(int(idx), {}).update(values)
    groups = [{k: tuple(v) if k in tkeys else v for k, v in g.items()}
              for g, tkeys in zip(meta["param_groups"], meta["tuple_keys"], strict=True)]
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def _on(tensors: dict, device: str) -> dict:
    """The tensors (made on the CPU) on `device`."""
    return tensors if device == "cpu" else {k: t.to(device) for k, t in tensors.items()}


# --- RNG states as JSON, so that trainer_state.json stays pickle-free ---------------------------------------------

def capture_rng() -> dict:
    """Python, NumPy, torch (and CUDA, if initialised) RNG states in a JSON-able dict."""
    import torch

    version, mt, gauss = random.getstate()
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # legacy=True (the default): the MT19937 tuple
    out = {"python": [version, list(mt), gauss],
           "numpy": [np_state[0], np_state[1].tolist(), *[x.item() if hasattr(x, "item") else x
                                                          for x in np_state[2:]]],
           "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(state: dict, log: Callable[[str], None] = print) -> None:
    """Set the RNG states `capture_rng` returned. CUDA states are restored per device index, as many as both the
    checkpoint and this process have: a checkpoint written with 2 GPUs visible resumes on 1 (the sampler allows a
    different world size) with device 0's state, and one written with 1 resumes on 2 leaving device 1 at its
    seed. With the count unchanged every device gets its own state back, bit for bit."""
    import torch

    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        saved, visible = state["cuda"], torch.cuda.device_count()
        for index, encoded in enumerate(saved[:visible]):
            torch.cuda.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(encoded)), dtype=torch.uint8),
                                     index)
        if len(saved) != visible:
            log(f"minilmd: the checkpoint holds CUDA RNG states of {len(saved)} device(s), {visible} visible now: "
                f"restored {min(len(saved), visible)}")


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


def snapshot_model(model, buffers: dict | None = None, state_of: Callable | None = None) -> dict:
    """A CPU copy of the model's state dict (or of `state_of(model)`: a LoRA run's adapters), which the loop may
    then go on changing. Pass the bare model, not a DDP or torch.compile wrapper (their keys carry a prefix)."""
    state = state_of(model) if state_of is not None else model.state_dict()
    return {k: _copy_to_cpu(v, buffers, "model." + k) for k, v in state.items()}


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
    pruned to `keep` valid checkpoints; with keep None it is not, and no checkpoint is read back (under a
    supervisor, which prunes scratch itself after a verified sync). `wait()` before exiting (and it re-raises a
    failure of the writer)."""

    def __init__(self, root: str | os.PathLike, keep: int | None, tokenizer: Tokenizer = None,
                 background: bool = True, log: Callable[[str], None] = print, state_of: Callable | None = None,
                 parents: bool = True):
        self.root, self.keep, self.background, self.log = Path(root), keep, background, log
        self.pinned = pin_root(self.root, parents)  # made now, once: a save never makes it again (ScratchGone)
        self.tokenizer = tokenizer_files(tokenizer)  # read once: every checkpoint carries these same bytes
        self.state_of = state_of  # what of the model is saved: its state_dict, or (LoRA) its adapters
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict = {}  # CPU snapshot buffers, reused from one save to the next (one save in flight)
        self.last_path: Path | None = None
        self.last_write_s: float = 0.0
        self.last_wait_s: float = 0.0
        self.extra: dict[str, bytes] = {}
        """Files written into every checkpoint besides the usual ones (a DPO run's reference sums)."""
        self.notes: dict = {}
        """Keys written into every checkpoint's manifest besides the usual ones (a stopped reference pass's)."""

    def save(self, step: int, model, optimizer, trainer_state: dict, best: bool = False) -> float:
        """Snapshot now, write in the background (then, with `best`, point BEST at it). Returns the seconds the
        caller was blocked: the wait for the previous write (also in `last_wait_s`: saves coming faster than writes
        show here) plus the snapshot."""
        t0 = time.perf_counter()
        self.wait()
        _still_there(self.pinned, step)  # here, in the loop: not a step trained on to the next save's wait
        self.last_wait_s = time.perf_counter() - t0
        args = (step, snapshot_model(model, self._buffers, self.state_of), snapshot_optimizer(optimizer, self._buffers),
                copy.deepcopy(trainer_state),
                optimizer_param_names(model, optimizer), best, (self.extra, self.notes))  # as they are now: the
        # caller may set others for its next save while this one is written (a DPO reference pass's periodic saves)
        if self.background:
            self._thread = threading.Thread(target=self._write, args=args, name=f"checkpoint-{step}")
            self._thread.start()
        else:
            self._write(*args)
            self.wait()
        return time.perf_counter() - t0

    def _write(self, step, model_state, optimizer_state, trainer_state, param_names, best, files) -> None:
        t0 = time.perf_counter()
        try:
            self.last_path = save(self.root, step, model_state, optimizer_state, trainer_state,
                                  tokenizer=self.tokenizer, param_names=param_names, extra=files[0], notes=files[1],
                                  pinned=self.pinned)
            if best:
                mark_best(self.root, self.last_path.name)
        except OSError as e:  # BEST's write into a root removed meanwhile: said as the save's would be
            why = self.pinned.gone()
            self._error = ScratchGone(self.root, step, why) if why is not None else e
        except BaseException as e:  # noqa: BLE001 - handed to the loop by wait(), which raises it there
            self._error = e
        else:
            _maybe_kill("before_prune", step)
            self.prune()
        self.last_write_s = time.perf_counter() - t0

    def prune(self) -> None:
        """Prune the root to `keep` valid checkpoints (nothing with keep None); a failure is logged, not raised."""
        if self.keep is None:
            return
        try:
            prune(self.root, self.keep, log=self.log)
        except Exception as e:  # noqa: BLE001 - housekeeping: never worth stopping the training for
            self.log(f"minilmd: pruning {self.root} failed: {type(e).__name__}: {e}")

    def wait(self) -> Path | None:
        """Block until the save in flight is on disk; raise its error if it failed. Returns its path."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return self.last_path
