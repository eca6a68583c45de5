"""Where a run starts from (trainer/loop/train.py's Trainer calls these while it is built): the newest valid
checkpoint, found by rank 0 and checked against what this run expects (its model, corpus, tokenizer, LoRA), with
the model, optimizer, RNG, step and sampler state it recorded; or, for a fresh run, the weights of [init] from;
and for a LoRA run, the frozen base init.from names at every start, which a resume must match."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as torch_dist

from minilmd.checkpoint import CheckpointMismatch
from minilmd.config import ConfigError, RunConfig
from minilmd.names import RUN_DIR_ENV
from minilmd.trainer.batches import growth
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.loop import multinode

if TYPE_CHECKING:
    from minilmd.trainer.loop.train import Trainer


def checkpoint_roots(cfg: RunConfig) -> list[Path]:
    roots = [cfg.checkpoint_dir]
    remote = cfg.run.remote
    # A supervisor has already fetched from the remote (in a thread): a stalled NFS must not hang the trainer.
    if remote and not os.environ.get(RUN_DIR_ENV) and ("://" not in remote or remote.startswith("file://")):
        roots.append(Path(remote.removeprefix("file://")))
    return roots


def resume(trainer: Trainer) -> None:
    """Load the newest valid checkpoint, if any: rank 0 finds it (and quarantines bad ones), all ranks load."""
    from minilmd.checkpoint_dirs import clean_stale_tmp
    from minilmd.checkpoint_select import find_latest

    found: list[str | None] = [None]
    if trainer.dist.is_main:
        clean_stale_tmp(trainer.cfg.checkpoint_dir)  # debris of a save killed mid-way
        path = find_latest(checkpoint_roots(trainer.cfg), trainer.expectation(), log=print)
        found = [str(path) if path else None]
    if trainer.dist.active:
        torch_dist.broadcast_object_list(found, src=0)
    if found[0] is None:
        return
    model_state, optimizer_state, state = multinode.load_checkpoint(Path(found[0]), trainer.dist)
    if trainer.cfg.lora.enabled:
        resume_adapter(trainer, Path(found[0]), model_state, state.get("init"))
    else:
        trainer.model.load_state_dict(model_state, strict=True)
        trainer.init_record = state.get("init")
    trainer.optimizer.load_state_dict(optimizer_state)
    if state.get("rng"):
        ckpt_io.restore_rng(state["rng"])
    trainer.step = trainer.step_base = int(state["step"])
    trainer.recorded_kernels = state.get("kernels")  # the run's attention kernel, kept (attention_choice)
    trainer.tokens_seen = int(state.get("tokens_seen", 0))
    trainer.rows_base = int(state.get("rows_seen", trainer.step * trainer.global_batch))
    trainer.early.restore(state.get("early_stop"))
    # A corpus grown by `prepare --append` since: the planned rows stay, new documents from the next epoch
    trainer.sampler = growth.resume_sampler(state, trainer.corpus, trainer.cfg.data.mode, trainer.cfg.train.seq_len,
                                            trainer.cfg.train.seed, trainer.sampler,
                                            trainer.cfg.train.micro_batch_size, trainer.cfg.data.doc_mask)
    trainer.resumed_from = Path(found[0])
    if trainer.dist.is_main:
        old = state.get("global_batch")
        note = f" (global batch was {old} rows, now {trainer.global_batch})" if old not in (
            None, trainer.global_batch) else ""
        print(f"minilmd: resumed from {found[0]} at step {trainer.step}{note}", flush=True)


def start_from_init(trainer: Trainer) -> None:
    """A fresh run (no checkpoint) takes the weights of [init] from; the optimizer and step stay fresh. Only
    here is init.from read: every later start resumes from this run's own checkpoints."""
    from minilmd.init_source import chosen
    from minilmd.trainer.checkpoint.init_weights import load_init

    weights, trainer.init_record = load_init(trainer.cfg)
    trainer.model.load_state_dict(weights, strict=True)
    if trainer.dist.is_main:
        print(f"minilmd: initialised from {trainer.init_record['path']} ({trainer.init_record['kind']})"
              f"{chosen(trainer.init_record)}", flush=True)


def start_lora(trainer: Trainer) -> None:
    """A LoRA run, at every start: the base init.from names, validated and fingerprinted anew, loaded and
    frozen; then the adapters on it (drawn from the seeded RNG; a resume overwrites them)."""
    from minilmd.trainer.checkpoint.init_weights import load_init
    from minilmd.trainer.model.lora import apply_lora

    try:
        weights, trainer.init_record = load_init(trainer.cfg)
    except ConfigError as e:
        raise ConfigError([f"{p} (the base this LoRA run trains its adapters on)" for p in e.problems],
                          e.source) from None
    trainer.model.load_state_dict(weights, strict=True)
    n = apply_lora(trainer.model, trainer.cfg.lora)
    if trainer.dist.is_main:
        print(f"minilmd: LoRA rank {trainer.cfg.lora.rank} on {', '.join(trainer.cfg.lora.targets)}: {n:,} "
              f"trainable parameters on the frozen base {trainer.init_record['path']}", flush=True)


def resume_adapter(trainer: Trainer, path: Path, adapter: dict, recorded_base: dict | None) -> None:
    """A LoRA checkpoint resumes only on the base it was trained on: the one init.from names now must have the
    fingerprint every checkpoint of this run records."""
    from minilmd.init_source import describe, same_source
    from minilmd.trainer.model.lora import load_adapter

    if not same_source(recorded_base, trainer.init_record):
        raise CheckpointMismatch(path, [f"its adapters were trained on the base {describe(recorded_base)}, but "
                                        f"init.from now gives {describe(trainer.init_record)}"], "model")
    load_adapter(trainer.model, adapter)
