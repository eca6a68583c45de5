"""A DPO run's data and its frozen reference (issue 42): the pair sampler (minilmd/plan/pairs.py), the validation
pairs, and the reference model's log-probability sums of every row, computed once.

The reference is the model the run starts from (`[init] from`: the SFT stage's weights; a LoRA run's base, its
adapters still zero). MiniMind's train_dpo.py keeps a second copy of it on the device and runs it on every step;
here it runs once, at the run's first start, over every document of both splits (length-bucketed batches, no
gradients), and its per-row sums (float32, one per document) are kept with the run: written into every checkpoint
as `dpo_reference.safetensors`, listed in the manifest (so hashed, validated, synced and staged like the weights).
The first start saves a checkpoint at step 0 at once (the Trainer does, with the bytes `start` returns), so a
restart, or a resume on another machine, reads the sums back (their sha256 checked against the manifest, with the
rest of the checkpoint: by rank 0 alone when the job spans nodes, trainer/loop/resume.py and multinode.py) and never
computes them again; the training step holds one model.
The seconds the computation took are printed and written to metrics.jsonl (`dpo_reference`). The pass can outlast
restart.hang_timeout (2,446 pairs: 40 s on a CPU): each batch refreshes the heartbeat, with the phase "reference"
and the pairs done ("0 reference 1200/3000/200/40": of all, and since this attempt's pass began 40 s ago at 200:
`minilmd status` shows "DPO reference pass 1,200/3,000 pairs, 25.0 pairs/s, ETA 72s"), and a pass over 10 s prints
its progress (PassProgress). A stop (SIGTERM/SIGINT: the Trainer's StopFlag) is acted on between two batches, agreed
by every rank: the sums so far and how far the pass got (KeptPass: the pairs done, in the pass's fixed order, and
the micro_batch_size) go into a step-0 checkpoint (StoppedInPass.kept, which the Trainer saves) and the trainer
exits 75 (73 when the stop was a full run.dir: StopFlag.exit_status); the next start resumes that checkpoint and
goes on from there (the same batches: the same sums, bit for bit), then saves step 0 again with every sum. The pass
saves that step 0 the same way every train.checkpoint_every (a steps value: every 5 min, saving.PASS_SAVE_EVERY_S),
agreed by every rank as the stop is: a kill (SIGKILL, OOM, a hang's) loses the pass since its last save, not all of
it.

The sums are a function of the reference model, the corpus and the rows as train.seq_len cuts them, so the file's
metadata records the corpus's fingerprint, the seq_len (which also sets the loss chunking: chunk_rows_for) and the
matmul precision; a resume at another seq_len is refused (ConfigError: exit 2) rather than trained on sums of other
rows: the reference model (the init weights) may no longer be at hand to compute them again. A file written before
seq_len was recorded is taken as computed at the run's current seq_len (it was then the only one the run knew: a
changed seq_len went unchecked before). Another matmul precision (a run moved from a bf16 GPU to a CPU) only shifts
the sums by its rounding: said, not refused, as resuming on another machine is a promise.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import torch

from minilmd.batch_stream import dpo_seq_len_refusal
from minilmd.config import ConfigError, RunConfig
from minilmd.corpus.analysis.stats import width_class
from minilmd.corpus.format import PreparedCorpus
from minilmd.corpus_meta import CorpusError
from minilmd.metrics import MetricsLog
from minilmd.names import DPO_REFERENCE, DPO_REFERENCE_PASS, HEARTBEAT_REFERENCE
from minilmd.plan.pairs import PairRows, PairSampler, check_pairs_fit, validation_pairs
from minilmd.plan.sampler_base import Batch
from minilmd.safetensors_scan import safetensors_metadata
from minilmd.stage_notes import DPO_WITHOUT_INIT
from minilmd.trainer.loop import step as step_mod
from minilmd.trainer.loop.exits import StoppedInPass
from minilmd.trainer.loop.guards import StopFlag
from minilmd.trainer.loop.objective_dpo import sequence_logps
from minilmd.trainer.model.loss import chunk_rows_for
from minilmd.untrusted import Unreadable, loads

if TYPE_CHECKING:
    from minilmd.trainer.loop.distributed import Dist
    from minilmd.trainer.loop.parts import Found
    from minilmd.trainer.loop.saving import Saves
    from minilmd.trainer.model.minimind import MiniMindForCausalLM


class ReferenceHost(Protocol):
    """What the reference pass uses of the run (the Trainer, trainer/loop/train.py): the model as the run starts from
    it, where it runs and with what autocast (the training step's own), the ranks, the metrics log (a heartbeat per
    batch), the step it is at, its stop flag and its saves (both asked between batches)."""

    @property
    def model(self) -> MiniMindForCausalLM: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def autocast(self) -> Callable[[], AbstractContextManager]: ...
    @property
    def log(self) -> MetricsLog: ...
    @property
    def dist(self) -> Dist: ...
    @property
    def step(self) -> int: ...
    @property
    def stop(self) -> StopFlag: ...
    @property
    def saves(self) -> Saves: ...


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
        self.resumed_at = 0
        """The pairs of the pass a stopped one kept, which this process went on from (0: none)."""

    @classmethod
    def of(cls, cfg: RunConfig, corpus: PreparedCorpus, is_main: bool) -> Preference | None:
        """A preference corpus's pairs; pairs whose replies train.seq_len cuts away are refused, or warned of."""
        if corpus.data_format != "dpo":
            return None
        preference = cls(cfg, corpus)
        check_pairs_fit(preference.rows, preference.val, corpus.meta, cfg, is_main)
        if is_main and not cfg.init.from_:  # from random weights: `run --check` notes it too (stage_notes.stage_notes)
            print(f"minilmd train: warning: {DPO_WITHOUT_INIT}", flush=True)
        return preference

    @property
    def rows(self) -> PairRows:
        return self.sampler.pairs

    def start(self, host: ReferenceHost, found: Found | None) -> tuple[list[Batch], dict[str, bytes]]:
        """The reference the checkpoint resumed carries (`found`: read by rank 0 and sent to the others with the rest
        of it, trainer/loop/resume.py), or computed now (`seconds` is then set: the caller saves a step-0 checkpoint
        at once, so that a restart reads it back); a pass a stop cut short (its step-0 checkpoint carries the sums
        done and how far it got: KeptPass) goes on from where it stopped. Returns the validation batches (they carry
        it) and the files every checkpoint of the run carries from now on ({DPO_REFERENCE: its bytes}).
        StoppedInPass, its `kept` the files of the pass so far, when a stop comes during the pass."""
        if found is not None and DPO_REFERENCE not in found.carried:  # computing it now: the trained policy's
            raise CorpusError(f"{found.path}: the checkpoint resumed carries no {DPO_REFERENCE} (every checkpoint "
                              "of a DPO run does: it was written by a run that did not train DPO on this corpus); "
                              "start the DPO stage as a run of its own, with [init] from naming that checkpoint")
        record = self.depends_on(host)
        kept: KeptPass | None = None
        if found is not None:  # its record as read (a file without seq_len: the current one), written on as it was
            sums, record, kept = reference_sums(found.carried[DPO_REFERENCE], self.corpus, found.path, record,
                                                host.dist.is_main)
        if found is None or kept is not None:
            sums = self.run_pass(host, record, kept)
        self.rows.reference, self.val.reference = sums["train"], sums["val"]
        pairs = self.rows.n_pairs + self.val.n_pairs
        if host.dist.is_main:
            computed = self.seconds is not None
            how = f"computed in {self.seconds:.2f}s" if computed else f"read from {found.path if found else ''}"
            if self.resumed_at:
                how += f" (going on from the {self.resumed_at:,} pairs a stopped pass kept)"
            host.log.write("dpo_reference", step=host.step, pairs=pairs,
                           seconds=None if self.seconds is None else round(self.seconds, 3),
                           source="computed" if computed else "checkpoint",
                           **({"resumed_at": self.resumed_at} if self.resumed_at else {}))
            print(f"minilmd: DPO reference log-probabilities of {pairs:,} pairs {how}", flush=True)
        batches = validation_pairs(self.val, self.cfg.data.val_windows, self.cfg.train.micro_batch_size)
        return batches, {DPO_REFERENCE: reference_bytes(sums, record)}

    def run_pass(self, host: ReferenceHost, record: dict, kept: KeptPass | None) -> dict[str, np.ndarray]:
        """The pass over both splits, train then val, from where a stopped one left off (`kept`; from the start
        when it ran at another micro_batch_size: its batches, and so the sums' rounding, were others). A stop
        raises StoppedInPass with the files of the pass so far (`kept`), which the Trainer saves at step 0."""
        mb = self.cfg.train.micro_batch_size
        sums = {"train": np.zeros(2 * self.rows.n_pairs, dtype=np.float32),
                "val": np.zeros(2 * self.val.n_pairs, dtype=np.float32)}
        if kept is not None and kept.micro_batch_size != mb:
            if host.dist.is_main:
                print(f"minilmd: note: the stopped DPO reference pass kept {kept.done:,} pairs computed at "
                      f"train.micro_batch_size = {kept.micro_batch_size}, now {mb}: computed again from the start "
                      "(other batches round otherwise)", flush=True)
            kept = None
        if kept is not None:
            sums = {name: value.copy() for name, value in kept.sums.items()}
        self.resumed_at = kept.done if kept is not None else 0
        progress = PassProgress(self.rows.n_pairs + self.val.n_pairs, host.dist.is_main, done=self.resumed_at)

        def kept_now() -> dict[str, bytes]:  # the reference file of the pass so far, as a save or a stop keeps it
            return {DPO_REFERENCE: reference_bytes(sums, record, KeptPass(sums, progress.done, mb))}

        try:
            self.compute(host, self.rows, progress, sums["train"], min(self.resumed_at, self.rows.n_pairs), kept_now)
            self.compute(host, self.val, progress, sums["val"], max(0, self.resumed_at - self.rows.n_pairs), kept_now)
        except StoppedInPass as stopped:
            stopped.kept = kept_now()
            raise
        self.seconds = progress.elapsed()
        return sums

    def depends_on(self, host: ReferenceHost) -> dict:
        """What the sums depend on besides the reference model, as the reference file's metadata records it."""
        return {"data_fingerprint": self.corpus.data_fingerprint, "seq_len": self.cfg.train.seq_len,
                "matmul": step_mod.matmul_dtype(self.cfg.train.dtype, host.device)}

    @torch.no_grad()
    def compute(self, host: ReferenceHost, rows: PairRows, progress: PassProgress, out: np.ndarray,
                first: int, kept_now: Callable[[], dict[str, bytes]]) -> None:
        """Into `out`, the model's log-probability sum over each document's targets, in batches of micro_batch_size
        pairs of similar length (each padded to its width class, as the training micro-batches are), from the
        `first` pair of their order on (those before it were computed by a pass a stop cut short: the batches are
        the same, so are the sums). Each batch refreshes the heartbeat (rate-limited): a pass longer than
        restart.hang_timeout is not a hang; a stop is acted on after it (StoppedInPass), and a save of the pass so
        far (`kept_now`: its reference file) when one is due (Saves.pass_due: rank 0's clock, agreed by every rank as
        the stop is), so that a kill (SIGKILL, OOM, a hang's) loses the pass since that save only."""
        model, device, autocast = host.model, host.device, host.autocast
        chunk_rows = chunk_rows_for(self.cfg.train.seq_len)  # the training step's (objective.build_objective)
        order = np.argsort(rows.lengths, kind="stable")
        mb = self.cfg.train.micro_batch_size
        was_training = model.training
        model.eval()
        try:
            for start in range(first, len(order), mb):
                pairs = order[start:start + mb]
                batch = rows.batch(pairs, width_class(int(rows.lengths[pairs].max()), rows.docs.seq_len))
                on_device = step_mod.to_device(batch, device)
                with autocast():
                    sums = sequence_logps(model, on_device.ids, on_device.labels, on_device.positions, chunk_rows)
                out[rows.documents(pairs)] = sums.float().cpu().numpy()
                progress.advance(len(pairs))
                host.log.heartbeat(host.step, phase=HEARTBEAT_REFERENCE, note=progress.note())
                stop, save_due = host.stop.agreed(host.dist, host.saves.pass_due())  # the same batch
                if stop:
                    raise StoppedInPass(host.stop.why(), host.stop.exit_status(), progress.done, progress.total)
                if save_due and progress.done < progress.total:  # at the end: the complete one, saved next
                    host.saves.save_pass(host.step, kept_now(), progress.done, progress.total)
        finally:
            model.train(was_training)


class KeptPass(NamedTuple):
    """What a stopped reference pass kept (in its step-0 checkpoint's reference file): the sums, the first `done`
    pairs of the pass's order filled in (train's, then val's), and the micro_batch_size its batches had."""

    sums: dict[str, np.ndarray]
    done: int
    micro_batch_size: int


class PassProgress:
    """The reference pass's progress line, `reference pass: 1,200/2,446 pairs, 45 s`: after each further tenth of
    the pairs once PROGRESS_S have passed since the last line, and every PROGRESS_MAX_S whatever the share (a long
    pass is never silent in the log, a short one prints none)."""

    PROGRESS_S = 10.0
    PROGRESS_MAX_S = 300.0

    def __init__(self, total: int, printing: bool, clock=time.perf_counter, done: int = 0):
        self.total, self.printing, self.clock = total, printing, clock
        self.done = self.started_at = done  # a pass going on from where a stopped one left off: the pairs it kept
        self.t0 = clock()
        self.last_line = (self.t0, done)  # (time, pairs done) of the last line printed

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def note(self) -> str:
        """The heartbeat's word for the pass: "DONE/TOTAL/FROM/SECONDS", the pairs done of all, those done when this
        attempt's pass began and its seconds since: `minilmd status` gives its rate and ETA from them
        (runstate.reference_pass_rate)."""
        return f"{self.done}/{self.total}/{self.started_at}/{int(self.elapsed())}"

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


RECORD_KEY = "reference"
"""The reference file's one metadata key: its record (Preference.depends_on) as JSON with sorted keys. One key, as
safetensors writes several in no fixed order: the file's bytes (its sha256 in every manifest) would differ from one
run to the next. A file written before the record has `data_fingerprint` alone as its key."""


PASS_KEY = DPO_REFERENCE_PASS
"""The tensor a stopped pass's reference file holds besides the sums: [pairs done, micro_batch_size] (KeptPass). A
minilmd that does not know it refuses such a file (its tensors are not one per document of each split) rather than
train on sums half of which are 0."""


def reference_bytes(sums: dict[str, np.ndarray], record: dict, kept: KeptPass | None = None) -> bytes:
    """The reference file: the sums, and what they depend on (Preference.depends_on) as its metadata; of a pass a
    stop cut short (`kept`), how far it got too. A file read back is written again with the record it was read
    with: that of the pass that computed the sums."""
    from safetensors.numpy import save

    tensors = {name: np.ascontiguousarray(value) for name, value in sums.items()}
    if kept is not None:
        tensors[PASS_KEY] = np.array([kept.done, kept.micro_batch_size], dtype=np.int64)
    return save(tensors, metadata={RECORD_KEY: json.dumps(record, sort_keys=True, separators=(",", ":"))})


def reference_sums(raw: bytes, corpus: PreparedCorpus, ckpt, now: dict,
                   printing: bool) -> tuple[dict[str, np.ndarray], dict, KeptPass | None]:
    """The sums in a reference file's bytes (as its checkpoint `ckpt`'s manifest vouches for them:
    resume.read_checkpoint), checked against the corpus (its fingerprint, one sum per document of each split):
    CorpusError when they do not fit it; and against this run's seq_len (`now`: Preference.depends_on): ConfigError
    when they were computed at another. Returns them, the file's record (its seq_len filled in when it has none) and,
    for a pass a stop cut short, what it kept (None: the sums are complete)."""
    from safetensors.numpy import load

    try:  # its checkpoint's validation scanned it (find_latest); its header parsed as that scan parses one
        metadata = safetensors_metadata(raw, DPO_REFERENCE)
    except ValueError as e:
        raise CorpusError(f"{ckpt / DPO_REFERENCE}: not a reference file minilmd reads: {e}") from None
    sums = load(raw)
    progress = sums.pop(PASS_KEY, None)
    recorded = _record(metadata)
    fingerprint = recorded.get("data_fingerprint")
    expected = {"train": corpus.train.n_docs, "val": corpus.val.n_docs}
    if fingerprint != corpus.data_fingerprint or {k: v.shape for k, v in sums.items()} != \
            {k: (n,) for k, n in expected.items()} or (progress is not None and progress.shape != (2,)):
        raise CorpusError(f"{ckpt / DPO_REFERENCE}: reference sums of another corpus (fingerprint "
                          f"{fingerprint}, shapes {[v.shape for v in sums.values()]})")
    then = recorded.setdefault("seq_len", now["seq_len"])  # a file without it: the run's current one
    if then != now["seq_len"]:
        raise ConfigError([dpo_seq_len_refusal(now["seq_len"], then, Path(ckpt).name)],  # run --check's words too
                          source=str(ckpt / DPO_REFERENCE))
    if printing and recorded.get("matmul", now["matmul"]) != now["matmul"]:
        print(f"minilmd: note: the DPO reference log-probs were computed with {recorded['matmul']} matmuls, this "
              f"attempt runs {now['matmul']}: the rewards carry the difference's rounding", flush=True)
    sums = {name: np.asarray(value, dtype=np.float32) for name, value in sums.items()}
    kept = None if progress is None else KeptPass(sums, int(progress[0]), int(progress[1]))
    return sums, recorded, kept


def _record(metadata: dict) -> dict:
    """The record in a reference file's metadata; an older file's `data_fingerprint` alone; {} for one unreadable
    (refused as of another corpus)."""
    if RECORD_KEY not in metadata:
        return {k: v for k, v in metadata.items() if k == "data_fingerprint"}
    try:
        return loads(metadata[RECORD_KEY], expect=dict)
    except Unreadable:
        return {}
