"""What a run expects of a checkpoint (Expectation), and the errors a checkpoint that cannot be used raises.

A checkpoint is intact or not (CheckpointInvalid: minilmd/checkpoint.py validates the files), and then of this run
or not (CheckpointMismatch: check_expectation compares what its trainer_state.json records with the run's config):
another model, [lora], doc_mask, kernel choice, tokenizer or corpus is refused, in the user's terms.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from minilmd import checkpoint_contents as contents
from minilmd.config import RunConfig
from minilmd.config_sections import weights_config
from minilmd.corpus_meta import data_fingerprint, earlier_versions


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
    `kind` is "model", "tokenizer" or "data" (the first difference found); `differences` names each setting that
    differs as (what, the checkpoint's, the run's), in words, for a refusal in the user's terms
    (daemon/jobs/resumefrom.py)."""

    def __init__(self, path, problems, kind: str, differences: tuple[tuple[str, str, str], ...] = ()):
        self.kind = kind
        self.differences = differences
        super().__init__(path, problems)

    @property
    def exit_status(self) -> int:
        """What refusing it ends the run with, for the trainer and the supervisor's fetch alike: another model is
        the config's fault (2), another tokenizer or corpus the data's (65)."""
        from minilmd.protocol import EXIT_CONFIG, EXIT_DATA

        return EXIT_CONFIG if self.kind == "model" else EXIT_DATA


@dataclass
class Expectation:
    """What a checkpoint must match to be resumed by this run. None: not checked."""

    model: dict | None = None
    """The run's ModelSection as a dict (RunConfig.model_dict())."""
    data_fingerprint: str | None = None
    """PreparedCorpus.data_fingerprint of the run's corpus."""
    tokenizer_fingerprint: str | None = None
    """PreparedCorpus.tokenizer_fingerprint (sha256 of tokenizer.json)."""
    lora: dict | None = None
    """The run's [lora] section when LoRA is on (RunConfig.lora_dict()), else None; compared whenever `model` is:
    a LoRA checkpoint holds adapters of that rank and those targets only."""
    data_ancestors: tuple[str, ...] = ()
    """Data fingerprints of the corpus's earlier versions (corpus.earlier_versions): the corpus grew by
    `prepare --append` since the checkpoint, which is still resumable (minilmd/plan/growth.py)."""
    doc_mask: bool | None = None
    """The run's data.doc_mask: a checkpoint records it in its config (absent: false, saved before it existed);
    the attention it was trained with is part of what a resume continues, so the other setting is refused."""
    deterministic: bool | None = None
    """The run's train.deterministic: a checkpoint records it in its config (absent: saved before it existed, and
    then the run's setting is taken); bit-exact resume is a property of the whole run, so the other is refused."""
    attention: str | None = None
    """The run's model.attention when it forces a backend (None for "auto", which keeps what was recorded): a
    checkpoint whose trainer_state "kernels" records another one is refused (a resume must not change kernels)."""

    @classmethod
    def for_corpus(cls, cfg: RunConfig, meta: dict | None = None) -> Expectation:
        """What the checkpoints of the run `cfg` must match: its model and [lora] sections and, given the meta.json
        of its prepared corpus (PreparedCorpus.meta, or read_meta's), that corpus's data and tokenizer fingerprints
        and its earlier versions. Without `meta` the fingerprints are not checked."""
        if meta is None:
            return cls(model=cfg.model_dict(), lora=cfg.lora_dict(), doc_mask=cfg.data.doc_mask,
                       **_kernel_expectation(cfg))
        return cls(model=cfg.model_dict(), data_fingerprint=data_fingerprint(meta),
                   tokenizer_fingerprint=meta["tokenizer_sha256"], lora=cfg.lora_dict(),
                   data_ancestors=tuple(earlier_versions(meta)), doc_mask=cfg.data.doc_mask,
                   **_kernel_expectation(cfg))


def _kernel_expectation(cfg: RunConfig) -> dict:
    forced = cfg.model.attention if cfg.model.attention != "auto" else None
    return {"deterministic": cfg.train.deterministic, "attention": forced}



def check_expectation(ckpt_dir: Path, state: dict, expected: Expectation | None) -> None:
    """`expected` against what the checkpoint's trainer_state.json records (its model and [lora] config, doc_mask,
    kernels, tokenizer and data fingerprints): CheckpointMismatch naming the first difference; nothing when None."""
    if expected is None:
        return
    if expected.model is not None:
        saved = weights_config((state.get("config") or {}).get("model") or {})
        keys = [k for k in sorted(set(saved) | set(expected.model)) if saved.get(k) != expected.model.get(k)]
        if keys:
            diff = [f"model.{k}: checkpoint {saved.get(k)!r}, run {expected.model.get(k)!r}" for k in keys]
            raise CheckpointMismatch(ckpt_dir, ["saved by a different model config: " + ", ".join(diff)], "model",
                                     tuple((f"model.{k}", _toml(saved.get(k)), _toml(expected.model.get(k)))
                                           for k in keys))
        lora = contents.saved_lora(state)
        if lora != expected.lora:
            was, now = contents.lora_text(lora), contents.lora_text(expected.lora)
            raise CheckpointMismatch(ckpt_dir, [f"saved with [lora] {was}; this run's [lora] is {now}"], "model",
                                     (("[lora]", was, now),))
    if expected.doc_mask is not None:
        saved_mask = ((state.get("config") or {}).get("data") or {}).get("doc_mask", False)
        if saved_mask != expected.doc_mask:
            raise CheckpointMismatch(ckpt_dir, [f"saved with data.doc_mask = {str(saved_mask).lower()}, the run has "
                                                f"{str(expected.doc_mask).lower()} (the attention it trained with)"],
                                     "model", (("data.doc_mask", _toml(saved_mask), _toml(expected.doc_mask)),))
    _check_kernels(ckpt_dir, state, expected)
    prints = state.get("fingerprints") or {}
    for kind, want in (("tokenizer", expected.tokenizer_fingerprint), ("data", expected.data_fingerprint)):
        if kind == "data" and prints.get(kind) in expected.data_ancestors:
            continue  # saved on an earlier version of this corpus: it only grew
        if want is not None and prints.get(kind) != want:
            raise CheckpointMismatch(ckpt_dir, [f"{kind} fingerprint differs: checkpoint {prints.get(kind)!r}, "
                                                f"run {want!r} (a different {kind} than this run uses)"], kind,
                                     ((f"{kind} fingerprint", str(prints.get(kind)), want),))


def _check_kernels(ckpt_dir: Path, state: dict, expected: Expectation) -> None:
    """train.deterministic and a forced model.attention against what the checkpoint recorded."""
    saved_det = ((state.get("config") or {}).get("train") or {}).get("deterministic")
    if expected.deterministic is not None and isinstance(saved_det, bool) and saved_det != expected.deterministic:
        raise CheckpointMismatch(ckpt_dir, [f"saved with train.deterministic = {str(saved_det).lower()}, the run has "
                                            f"{str(expected.deterministic).lower()} (whether the run is bit-exact "
                                            f"on the GPU is decided at its start and kept)"], "model",
                                 (("train.deterministic", _toml(saved_det), _toml(expected.deterministic)),))
    found = state.get("kernels")
    kernels: dict = found if isinstance(found, dict) else {}
    saved_attention = kernels.get("attention")
    if expected.attention is not None and isinstance(saved_attention, str) and saved_attention != expected.attention:
        how = kernels.get("attention_how", "")
        setting = saved_attention if how == "forced" else "auto"  # a kernel auto chose ("default" too): no setting
        raise CheckpointMismatch(ckpt_dir, [f"trained with attention kernel {saved_attention!r}"
                                            f"{f' ({how})' if how else ''}, the run forces model.attention = "
                                            f"{expected.attention!r}: a resume must not change kernels (set "
                                            f"model.attention = \"auto\" to keep {saved_attention!r})"], "model",
                                 (("model.attention", _toml(setting), _toml(expected.attention)),))


def _toml(value) -> str:
    """A setting's value as the config spells it (true, "flash", 64), for CheckpointMismatch.differences."""
    if value is None:
        return "unset"
    return str(value).lower() if isinstance(value, bool) else f'"{value}"' if isinstance(value, str) else str(value)
