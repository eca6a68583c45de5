"""The weights `[init] from` names, loaded for a fresh run (the torch half of minilmd/init_source.py).

A minilmd checkpoint is validated strictly first (hashes, shapes, finiteness) against the run's model config: a
damaged one or one of another model is refused, never half-used. A MiniMind .pth is read once as untrusted into
memory, no bigger than a state dict of the run's model can be, and hashed as read (minilmd/init_source.py
`read_pth`); those bytes are unpickled with `torch.load(weights_only=True)` (no code runs from the file); its keys
are ours plus `lm_head.weight`, the tied embedding, which must equal `model.embed_tokens.weight` (minilmd's model
ties them); fp16/bf16 become fp32. Every refusal is a ConfigError (exit 2): the config names a source that cannot
start this run.
"""
from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from minilmd.config import ConfigError, RunConfig
from minilmd.init_model import HEAD_NOT_TIED, model_mismatch, resume_file, shapes_mismatch, unwrapped
from minilmd.init_pth import InitSourceTooBig, read_pth
from minilmd.init_source import (
    InitSource,
    InitSourceError,
    adapter_source,
    fingerprint,
    resolve,
    source_model,
)
from minilmd.model_shapes import EMBED_KEY, TIED_HEAD_KEY
from minilmd.pth_shapes import is_minimind_resume


def _refuse(cfg: RunConfig, problem: str) -> ConfigError:
    return ConfigError([f"init.from = {cfg.init.from_!r}: {problem}"], cfg.source)


def load_init(cfg: RunConfig) -> tuple[dict, dict]:
    """(fp32 weights for MiniMindForCausalLM.load_state_dict, the fingerprint record) of cfg.init.from_."""
    if cfg.init.staged:
        return _staged_weights(cfg, Path(cfg.init.staged))
    try:
        source = resolve(cfg.init.from_, cfg.init.checkpoint)
        if source.kind == "checkpoint":
            weights, record = _checkpoint_weights(cfg, source)
            return weights, {"from": cfg.init.from_, **record}
        data, record = read_pth(source, cfg.model_dict())  # hashed as read: the record is of what gets loaded
        return _pth_weights(cfg, data), {"from": cfg.init.from_, **record}
    except InitSourceError as e:
        raise _refuse(cfg, str(e)) from None
    except OSError as e:
        raise _refuse(cfg, f"cannot be read: {e}") from None


def _staged_weights(cfg: RunConfig, staged: Path) -> tuple[dict, dict]:
    """init.from's copy the supervisor staged in scratch (daemon/jobs/initstage.py): only scratch is read. The
    record is the source's as init.from names it (its path, its hashes), so lineage and a LoRA resume's
    `same_source` see the source itself. A copy whose hashes are not the record's is damaged scratch, a data
    error (65): the supervisor verifies it, stages it again and restarts, where a config error would be final.
    (Raised as a CheckpointMismatch of kind "data": a ValueError would be taken for the model refusing the config.)"""
    from minilmd.init_source import same_source, staged_copy, staged_record

    data = None
    try:
        record = staged_record(staged)
        source = InitSource(str(record.get("kind")), staged_copy(staged))
        if source.kind == "checkpoint":
            found = fingerprint(source)
        else:
            data, found = read_pth(source, cfg.model_dict())
    except InitSourceTooBig as e:  # the source is (staging copies it byte for byte): this model's config refuses it
        raise _refuse(cfg, str(e)) from None
    except Exception as e:  # noqa: BLE001 - unreadable or missing scratch: stage again
        raise _damaged(staged, f"cannot be read: {e}") from None
    if record.get("from") != cfg.init.from_ or not same_source(record, found):
        raise _damaged(staged, f"not the source's ({record.get('from')!r}): damaged or stale scratch")
    weights = _pth_weights(cfg, data) if data is not None else _checkpoint_weights(cfg, source, found)[0]
    return weights, {**record, "from": cfg.init.from_}


def _damaged(staged: Path, problem: str):
    from minilmd.checkpoint import CheckpointMismatch

    return CheckpointMismatch(staged, [f"the staged copy of init.from is {problem}"], "data")


def _checkpoint_weights(cfg: RunConfig, source: InitSource, staged_record: dict | None = None) -> tuple[dict, dict]:
    """(the weights of a checkpoint validated against the run's model, deserialized from the very bytes validation
    hashed and scanned; its fingerprint record). The record must name the manifest validation read: the record
    is read apart from it (init_source.fingerprint; staged_record: the staged copy's, taken before), and another
    manifest there means the checkpoint is being replaced, so nothing of it is used."""
    from safetensors.torch import load

    from minilmd.checkpoint import (
        CheckpointError,
        CheckpointInvalid,
        CheckpointMismatch,
        Expectation,
        validated_weights,
    )
    from minilmd.names import MANIFEST

    staged = staged_record is not None
    try:
        validated = validated_weights(source.path, Expectation(model=cfg.model_dict()))
        record = staged_record if staged_record is not None else fingerprint(source)
        if record.get("manifest_sha256") != validated.manifest_sha256:
            raise CheckpointInvalid(source.path, f"{MANIFEST} changed while it was read (replaced since it was "
                                                 f"validated): nothing of it is loaded")
        return load(validated.weights), record  # the bytes validated, never the path read again
    except CheckpointMismatch as e:
        if e.differences and e.differences[0][0] == "[lora]":  # the expectation has no [lora]: a LoRA run's
            raise _refuse(cfg, f"names a checkpoint of {adapter_source(e.differences[0][1])}") from None
        if e.kind == "model" and (mismatch := _recorded_mismatch(cfg, source)):
            raise _refuse(cfg, f"{source.path} holds {mismatch}") from None
        raise _refuse(cfg, "; ".join(e.problems).replace("checkpoint", "source")) from None
    except CheckpointError as e:
        if staged:  # it verified when staged: scratch damaged since, a data error (staged again), not the config
            raise _damaged(source.path, f"damaged: {'; '.join(e.problems)}") from None
        raise _refuse(cfg, f"the checkpoint is invalid: {'; '.join(e.problems)}") from None


def _recorded_mismatch(cfg: RunConfig, source: InitSource) -> str:
    """The checkpoint's recorded [model] against the run's in `run --check`'s words (init_model.model_mismatch);
    "" where it cannot be read or does not differ."""
    try:
        saved = source_model(source)
    except ValueError:
        return ""
    return model_mismatch(saved, cfg.model_dict(), cfg.is_set) if saved is not None else ""


def _pth_weights(cfg: RunConfig, data: BinaryIO) -> dict:
    """The weights of a .pth's bytes as `read_pth` read them (never its path again: a file swapped since is not)."""
    import torch

    try:
        state = torch.load(data, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a pickle that is not a plain state dict fails in many ways
        raise _refuse(cfg, f"not a loadable state dict ({type(e).__name__}: {e})") from None
    if is_minimind_resume(state):  # `run --check`'s words (init_pth.pth_problems)
        raise _refuse(cfg, resume_file(Path(cfg.init.from_).name))
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise _refuse(cfg, "not a state dict of tensors")
    state, _ = unwrapped(dict(state))  # a DDP or torch.compile save: `run --check` says so (init_pth.pth_note)
    head = state.pop(TIED_HEAD_KEY, None)
    if head is not None and EMBED_KEY in state and not torch.equal(head, state[EMBED_KEY]):
        raise _refuse(cfg, HEAD_NOT_TIED)
    mismatch = shapes_mismatch({k: tuple(v.shape) for k, v in state.items()}, cfg.model, cfg.is_set,
                               cfg.init.from_)
    if mismatch:  # `run --check`'s rule and words, there of the shapes read without torch (minilmd/pth_shapes.py)
        raise _refuse(cfg, mismatch)
    return {k: v.to(torch.float32).contiguous() for k, v in state.items()}
