"""Where a run starts from (trainer/loop/train.py's Trainer calls these while it is built): the newest valid
checkpoint, found by rank 0 and checked against what this run expects (its model, corpus, tokenizer, LoRA), with
the model, optimizer and trainer state it recorded (returned as a Found, which the Trainer applies: the state to its
parts, trainer/loop/parts.py); or, for a fresh run, the weights of [init] from; and for a LoRA run, the frozen base
init.from names at every start, which a resume must match."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from minilmd.checkpoint import CheckpointMismatch, Expectation
from minilmd.checkpoint_load import ForLoading, for_loading
from minilmd.config import ConfigError, RunConfig, stage_defaults
from minilmd.names import DPO_REFERENCE, DPO_REFERENCE_MAX_BYTES
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.loop import multinode
from minilmd.trainer.loop.distributed import Dist
from minilmd.trainer.loop.parts import Found


def resume(cfg: RunConfig, dist: Dist, expectation: Expectation) -> Found | None:
    """The newest valid checkpoint and what it holds, or None: rank 0 finds it (and quarantines bad ones), all ranks
    load it. Nothing is applied here: the Trainer does that, in one place (Trainer.apply_resume).
    Rank 0 loads what its validation read (checkpoint_load.validated_for_loading): each file read and hashed once, the
    bytes loaded those verified; the other ranks of its node read and check it themselves (read_checkpoint)."""
    from minilmd.checkpoint_dirs import clean_stale_tmp
    from minilmd.checkpoint_load import validated_for_loading
    from minilmd.checkpoint_select import checkpoint_roots, first_valid

    found: list[str | None] = [None]
    taken = None
    if dist.is_main:
        clean_stale_tmp(cfg.checkpoint_dir)  # debris of a save killed mid-way
        taken = first_valid(checkpoint_roots(cfg), lambda path: validated_for_loading(path, expectation, CARRIED),
                            log=print)
        found = [str(taken[0]) if taken else None]
    if dist.active:
        torch_dist.broadcast_object_list(found, src=0)
    if found[0] is None:
        return None
    if taken is not None:
        parts = taken[1]
        return multinode.load_checkpoint(taken[0], dist, lambda path: _found(path, parts))
    return multinode.load_checkpoint(Path(found[0]), dist, read_checkpoint)


CARRIED = {DPO_REFERENCE: DPO_REFERENCE_MAX_BYTES}
"""The files a run keeps in its checkpoints besides model, optimizer and state, with the most of each read."""


def read_checkpoint(path: Path) -> Found:
    """All a resume takes from a checkpoint (find_latest validated it): the model, optimizer and trainer state, and
    the CARRIED files it lists, each read once and checked against one reading of the manifest, and loaded from
    those bytes (checkpoint_load.for_loading)."""
    return _found(path, for_loading(path, CARRIED))


def _found(path: Path, parts: ForLoading) -> Found:
    model_state, optimizer_state, state, carried = ckpt_io.loaded(parts)
    return Found(path, model_state, optimizer_state, state, carried)


def start_from_init(cfg: RunConfig, model: torch.nn.Module, dist: Dist) -> dict:
    """A fresh run (no checkpoint) takes the weights of [init] from; the optimizer and step stay fresh. Only
    here is init.from read: every later start resumes from this run's own checkpoints. Returns its record."""
    from minilmd.init_words import chosen
    from minilmd.trainer.checkpoint.init_weights import load_init

    weights, record = load_init(cfg)
    model.load_state_dict(weights, strict=True)
    if dist.is_main:
        print(f"minilmd: initialised from {record['path']} ({record['kind']}){chosen(record)}", flush=True)
    return record


def start_lora(cfg: RunConfig, model: torch.nn.Module, dist: Dist) -> dict:
    """A LoRA run, at every start: the base init.from names, validated and fingerprinted anew, loaded and
    frozen; then the adapters on it (drawn from the seeded RNG; a resume overwrites them). Returns the base's
    record."""
    from minilmd.trainer.checkpoint.init_weights import load_init
    from minilmd.trainer.model.lora import apply_lora

    try:
        weights, record = load_init(cfg)
    except ConfigError as e:
        raise ConfigError([f"{p} (the base this LoRA run trains its adapters on)" for p in e.problems],
                          e.source) from None
    model.load_state_dict(weights, strict=True)
    n = apply_lora(model, cfg.lora)
    if dist.is_main:
        print(f"minilmd: LoRA rank {cfg.lora.rank} on {', '.join(cfg.lora.targets)}: {n:,} "
              f"trainable parameters on the frozen base {record['path']}", flush=True)
    return record


def load_model_state(model: torch.nn.Module, found: Found, lora: bool, base_now: dict | None) -> None:
    """The checkpoint's weights into `model`: all of them, or a LoRA run's adapters, which resume only on the base
    they were trained on: the one init.from gives now (base_now) must have the fingerprint every checkpoint of this
    run records."""
    from minilmd.init_source import same_source
    from minilmd.init_words import describe
    from minilmd.trainer.model.lora import load_adapter

    if not lora:
        model.load_state_dict(found.model_state, strict=True)
        return
    recorded_base = found.state.get("init")
    if not same_source(recorded_base, base_now):
        raise CheckpointMismatch(found.path, [f"its adapters were trained on the base {describe(recorded_base)}, "
                                              f"but init.from now gives {describe(base_now)}"], "model")
    load_adapter(model, found.model_state)


def announce(found: Found, step: int, global_batch: int) -> None:
    old = found.state.get("global_batch")
    note = f" (global batch was {old} rows, now {global_batch})" if old not in (None, global_batch) else ""
    print(f"minilmd: resumed from {found.path} at step {step}{note}", flush=True)



def start_lines(cfg: RunConfig, total: int, trainable: int, where: str, steps: tuple[int, int], global_batch: int,
                data_format: str, defaults: dict[str, Any]) -> list[str]:
    """The trainer's lines as it starts training: what trains (of a LoRA run, the adapters' share of the `total`
    parameters), where (`where`: "cpu x 1"), on what rows (a DPO run's batches count pairs, two rows each), the
    steps (from, to); the stage's `defaults` it applied."""
    trained = f"{total:,} parameters"
    if cfg.lora.enabled:  # the frozen base is most of the total: say how much of it trains
        trained = f"{trainable:,} of {trained} (LoRA)"
    t = cfg.train
    rows = (f"preference pairs of up to {t.seq_len} tokens a side, global batch {global_batch} pairs"
            if data_format == "dpo" else f"{cfg.data.mode} rows of {t.seq_len}, global batch {global_batch} rows")
    ignored = f" (gpu.count = {cfg.gpu.count} is ignored on the CPU)" if cfg.gpu.count > 1 and where == "cpu x 1" \
        else ""  # the supervisor launches one trainer on the CPU (daemon/phases/gpuwait.py nproc)
    lines = [f"training {trained} on {where}{ignored}, {rows}, steps {steps[0]} -> {steps[1]}"]
    if defaults:
        stage = stage_defaults(data_format, cfg.lora.enabled)[0]
        said = ", ".join(f"{key} = {value!r}" for key, value in defaults.items())
        lines.append(f"{data_format} corpus, {stage} defaults: {said}")
    return lines
