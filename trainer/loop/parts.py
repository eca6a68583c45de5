"""The parts of a run's state that a checkpoint carries besides the model and the optimizer, each owning its own:
the train state (step, where the rows stand, tokens seen, the [init] record), the sampler cursor (the sampler and
the corpus segments it reads), the RNG streams, and early stop (minilmd/plan/early_stop.py).

Each part has `state_dict()` (the keys of trainer_state.json it owns, JSON-able) and `load_state_dict(state)` (reads
them back from a checkpoint's whole trainer_state.json), as torchtitan's components do; the Trainer writes the union
of the fragments and, on a resume, hands the same recorded state to every part in one place (Trainer.apply_resume).
The keys and their meaning are those checkpoints have always had: old checkpoints resume unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from minilmd.corpus.format import PreparedCorpus
from minilmd.plan import growth
from minilmd.plan.sampler_base import Sampler
from minilmd.plan.trainer_state import POSITIONS_SEEN, ROWS_SEEN, STEP, TOKENS_SEEN, Trained, rows_seen, trained


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class TrainState:
    """Where the run stands. The global batch of optimizer step s starts at row rows_base + (s - step_base) * G:
    a resume with another global batch G keeps the rows already trained and goes on from there; so do the token
    positions, positions_base + (s - step_base) * G * seq_len, that a budget in tokens counts."""

    global_batch: int
    """Rows per optimizer step over all ranks, a constant of this attempt."""
    step: int = 0
    tokens_seen: int = 0
    rows_base: int = 0
    step_base: int = 0
    seq_len: int = 0
    """The tokens a row is cut at, a constant of this attempt."""
    positions_base: int = 0
    init_record: dict | None = None
    """What [init] from was (its path, kind and fingerprint), carried from checkpoint to checkpoint."""

    def first_row(self, step: int) -> int:
        return self.rows_base + (step - self.step_base) * self.global_batch

    def trained(self) -> Trained:
        """What the run has trained up to this step (the budget's count: plan/budget.py)."""
        return Trained(self.step, self.first_row(self.step),
                       self.positions_base + (self.step - self.step_base) * self.global_batch * self.seq_len)

    def state_dict(self) -> dict:
        """Its keys but the step, which the checkpoint writer records (trainer/checkpoint/save.py: one writer)."""
        return {TOKENS_SEEN: self.tokens_seen, ROWS_SEEN: self.first_row(self.step),
                POSITIONS_SEEN: self.trained().positions, "init": self.init_record}

    def load_state_dict(self, state: dict) -> None:
        """A record already held wins over the recorded one: a LoRA run reads its base anew at every start (and the
        resume checks it against the recorded one, resume.load_model_state)."""
        self.step = self.step_base = int(state[STEP])
        self.tokens_seen = int(state.get(TOKENS_SEEN, 0))
        self.rows_base = rows_seen(state, self.global_batch) or 0
        done = trained(state, self.global_batch, self.seq_len)
        self.positions_base = done.positions if done is not None else self.rows_base * self.seq_len
        if self.init_record is None:
            self.init_record = state.get("init")


@dataclass
class SamplerCursor:
    """The sampler the rows come from, and what a checkpoint records of the corpus under it: its segments (a corpus
    grown by `prepare --append` since a checkpoint keeps the planned rows and adds the new documents from the next
    epoch, minilmd/plan/growth.py)."""

    sampler: Sampler
    corpus: PreparedCorpus
    """The opened corpus: its train split, fingerprint and meta."""
    mode: str
    seq_len: int
    seed: int
    micro_batch_size: int
    doc_mask: bool

    def epoch_of_row(self, row: int) -> int:
        return row // self.sampler.items_per_epoch

    def state_dict(self) -> dict:
        return {"data_segments": growth.segments_of(self.sampler, self.corpus)}

    def load_state_dict(self, state: dict) -> None:
        self.sampler = growth.resume_sampler(state, self.corpus, self.mode, self.seq_len, self.seed, self.sampler,
                                             self.micro_batch_size, self.doc_mask)


class RngState:
    """The Python, NumPy, torch and CUDA generators of this process (LoRA dropout draws from torch's)."""

    def state_dict(self) -> dict:
        from minilmd.trainer.checkpoint.save import capture_rng

        return {"rng": capture_rng()}

    def load_state_dict(self, state: dict) -> None:
        from minilmd.trainer.checkpoint.save import restore_rng

        if state.get("rng"):
            restore_rng(state["rng"])


@dataclass(frozen=True)
class Found:
    """What resume() found: the newest valid checkpoint and what it holds, for the Trainer to apply."""

    path: Path
    model_state: dict[str, torch.Tensor]
    """Every weight, or a LoRA run's adapters."""
    optimizer_state: dict
    state: dict
    """Its trainer_state.json, whole: each part reads its own keys."""
    carried: dict[str, bytes] = field(default_factory=dict)
    """The other files a run keeps in its checkpoints, by name, as checked against the manifest (resume.CARRIED: a
    DPO run's reference sums); they travel to every rank with the rest."""
