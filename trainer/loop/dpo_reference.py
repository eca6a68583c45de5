"""A DPO run's data and its frozen reference (issue 42): the pair sampler (minilmd/plan/pairs.py), the validation
pairs, and the reference model's log-probability sums of every row, computed once.

The reference is the model the run starts from (`[init] from`: the SFT stage's weights; a LoRA run's base, its
adapters still zero). MiniMind's train_dpo.py keeps a second copy of it on the device and runs it on every step;
here it runs once, at the run's first start, over every document of both splits (length-bucketed batches, no
gradients), and its per-row sums (float32, one per document) are kept with the run: written into every checkpoint
as `dpo_reference.safetensors`, listed in the manifest (so hashed, validated, synced and staged like the weights).
The first start saves a checkpoint at step 0 at once, so a restart, or a resume on another machine, reads the sums
back (their sha256 checked against the manifest) and never computes them again; the training step holds one model.
The seconds the computation took are printed and written to metrics.jsonl (`dpo_reference`). The pass can
outlast restart.hang_timeout (2,446 pairs: 40 s on a CPU): each batch refreshes the heartbeat, and a pass over
10 s prints its progress (PassProgress).
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minilmd.checkpoint import read_manifest
from minilmd.config import RunConfig
from minilmd.corpus.analysis.stats import width_class
from minilmd.corpus.format import PreparedCorpus
from minilmd.corpus_meta import CorpusError
from minilmd.names import DPO_REFERENCE
from minilmd.plan.pairs import PairRows, PairSampler, validation_pairs
from minilmd.plan.sampler_base import Batch
from minilmd.trainer.loop import step as step_mod
from minilmd.trainer.loop.objective_dpo import sequence_logps
from minilmd.untrusted import Unreadable, read_bytes

REFERENCE_FILE = DPO_REFERENCE
"""The reference sums in a checkpoint: tensors "train" and "val" (float32, one per document of the split)."""


class Preference:
    """What a DPO run holds besides the Trainer's usual parts: its train pairs, val pairs, and their reference."""

    def __init__(self, cfg: RunConfig, corpus: PreparedCorpus):
        t = cfg.train
        train, val = corpus.train, corpus.val
        assert train.loss_mask is not None and val.loss_mask is not None  # a preference corpus has its masks
        self.cfg, self.corpus = cfg, corpus
        self.sampler = PairSampler(train.tokens, train.doc_starts, t.seq_len, t.seed, t.micro_batch_size,
                                   train.loss_mask)
        self.val = PairRows(val.tokens, val.doc_starts, t.seq_len, val.loss_mask)
        self.seconds: float | None = None
        """How long the reference took to compute in this process (None: read from a checkpoint)."""

    @classmethod
    def of(cls, cfg: RunConfig, corpus: PreparedCorpus) -> Preference | None:
        return cls(cfg, corpus) if corpus.data_format == "dpo" else None

    @property
    def rows(self) -> PairRows:
        return self.sampler.pairs

    def start(self, trainer: Any, found_path: Path | None) -> list[Batch]:
        """The reference read from the checkpoint resumed (found_path), or computed now and saved at once in a
        step-0 checkpoint; every checkpoint carries it. Returns the validation batches (they carry it)."""
        sums = read_reference(found_path, self.corpus) if found_path is not None else None
        if found_path is not None and sums is None:  # computing it now would take the trained policy for the reference
            raise CorpusError(f"{found_path}: the checkpoint resumed carries no {REFERENCE_FILE} (every checkpoint "
                              "of a DPO run does: it was written by a run that did not train DPO on this corpus); "
                              "start the DPO stage as a run of its own, with [init] from naming that checkpoint")
        if sums is None:
            progress = PassProgress(self.rows.n_pairs + self.val.n_pairs, trainer.dist.is_main)
            sums = {"train": self.compute(trainer, self.rows, progress),
                    "val": self.compute(trainer, self.val, progress)}
            self.seconds = progress.elapsed()
        self.rows.reference, self.val.reference = sums["train"], sums["val"]
        trainer.checkpointer.extra = {REFERENCE_FILE: reference_bytes(sums, self.corpus)}
        pairs = self.rows.n_pairs + self.val.n_pairs
        if trainer.dist.is_main:
            how = (f"computed in {self.seconds:.2f}s" if self.seconds is not None
                   else f"read from {found_path}")
            trainer.log.write("dpo_reference", step=trainer.step, pairs=pairs,
                              seconds=None if self.seconds is None else round(self.seconds, 3),
                              source="computed" if self.seconds is not None else "checkpoint")
            print(f"minilmd: DPO reference log-probabilities of {pairs:,} pairs {how}", flush=True)
        if self.seconds is not None and found_path is None:
            trainer.save()  # kept with the run from now on: a restart reads it back
        return validation_pairs(self.val, self.cfg.data.val_windows, self.cfg.train.micro_batch_size)

    @torch.no_grad()
    def compute(self, trainer: Any, rows: PairRows, progress: PassProgress) -> np.ndarray:
        """The model's log-probability sum over each document's targets, in batches of micro_batch_size pairs of
        similar length (each padded to its width class, as the training micro-batches are). Each batch refreshes
        the heartbeat (rate-limited): a pass longer than restart.hang_timeout is not a hang."""
        model, device = trainer.model, trainer.device
        chunk_rows = trainer.objective.chunk_rows
        out = np.zeros(2 * rows.n_pairs, dtype=np.float32)
        order = np.argsort(rows.lengths, kind="stable")
        mb = self.cfg.train.micro_batch_size
        was_training = model.training
        model.eval()
        try:
            for start in range(0, len(order), mb):
                pairs = order[start:start + mb]
                batch = rows.batch(pairs, width_class(int(rows.lengths[pairs].max()), rows.docs.seq_len))
                on_device = step_mod.to_device(batch, device)
                with trainer.autocast():
                    sums = sequence_logps(model, on_device.ids, on_device.labels, on_device.positions, chunk_rows)
                out[rows.documents(pairs)] = sums.float().cpu().numpy()
                trainer.log.heartbeat(trainer.step)
                progress.advance(len(pairs))
        finally:
            model.train(was_training)
        return out


class PassProgress:
    """The reference pass's progress line, `reference pass: 1,200/2,446 pairs, 45 s`: after each further tenth of
    the pairs once PROGRESS_S have passed since the last line, and every PROGRESS_MAX_S whatever the share (a long
    pass is never silent in the log, a short one prints none)."""

    PROGRESS_S = 10.0
    PROGRESS_MAX_S = 300.0

    def __init__(self, total: int, printing: bool, clock=time.perf_counter):
        self.total, self.printing, self.clock = total, printing, clock
        self.done = 0
        self.t0 = clock()
        self.last_line = (self.t0, 0)  # (time, pairs done) of the last line printed

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def advance(self, pairs: int) -> None:
        self.done += pairs
        now = self.clock()
        since, done_then = now - self.last_line[0], self.last_line[1]
        if self.done >= self.total or not self.printing:
            return
        if since >= self.PROGRESS_MAX_S or (since >= self.PROGRESS_S and (self.done - done_then) * 10 >= self.total):
            self.last_line = (now, self.done)
            print(f"minilmd: DPO reference pass: {self.done:,}/{self.total:,} pairs, {now - self.t0:.0f} s",
                  flush=True)


def reference_bytes(sums: dict[str, np.ndarray], corpus: PreparedCorpus) -> bytes:
    from safetensors.numpy import save

    return save({name: np.ascontiguousarray(value) for name, value in sums.items()},
                metadata={"data_fingerprint": corpus.data_fingerprint})


def read_reference(ckpt_dir: Path, corpus: PreparedCorpus) -> dict[str, np.ndarray] | None:
    """The sums a checkpoint carries, checked against its manifest (size, sha256) and the corpus (fingerprint, one
    per document); None when it carries none. CorpusError when they do not fit the corpus."""
    from safetensors.numpy import load

    entry = read_manifest(ckpt_dir).get("files", {}).get(REFERENCE_FILE)
    if not isinstance(entry, dict):
        return None
    try:
        raw = read_bytes(ckpt_dir / REFERENCE_FILE, max_bytes=int(entry["size"]))
    except Unreadable as e:
        raise CorpusError(f"{ckpt_dir / REFERENCE_FILE}: {e.why}") from None
    if len(raw) != entry["size"] or hashlib.sha256(raw).hexdigest() != entry["sha256"]:
        raise CorpusError(f"{ckpt_dir / REFERENCE_FILE}: not the file its manifest lists (size or sha256)")
    sums = load(raw)  # the bytes checked above, never the file read again
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    fingerprint = (header.get("__metadata__") or {}).get("data_fingerprint")
    expected = {"train": corpus.train.n_docs, "val": corpus.val.n_docs}
    if fingerprint != corpus.data_fingerprint or {k: v.shape for k, v in sums.items()} != \
            {k: (n,) for k, n in expected.items()}:
        raise CorpusError(f"{ckpt_dir / REFERENCE_FILE}: reference sums of another corpus (fingerprint "
                          f"{fingerprint}, shapes {[v.shape for v in sums.values()]})")
    return {name: np.asarray(value, dtype=np.float32) for name, value in sums.items()}
