"""Early stopping on the validation loss, and the retention probe evaluated beside it.

`EarlyStop` follows the val loss of every validation (every train.eval_every steps and at each epoch's end): a
new best (below the best by more than early_stop.min_delta) resets the count; `patience` validations in a row
without one stop the run cleanly (exit 0, like a finished budget). Its state travels in trainer_state.json (a part
with state_dict/load_state_dict, trainer/loop/parts.py), so a resumed run counts on where it left off. The trainer
keeps the checkpoint of each new best (BEST, which pruning, the sync and the remote's retention keep besides the
newest).

`probe_batches`: the val split of an earlier stage's prepared corpus ([eval] probe), whose loss shows forgetting.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minilmd.config import ConfigError, RunConfig


@dataclass
class EarlyStop:
    patience: int
    """0: never stop (the best is still followed, for the metrics)."""
    min_delta: float
    best_step: int | None = None
    best_val_loss: float | None = None
    since_best: int = 0
    """Validations since the best one."""

    @classmethod
    def from_config(cls, cfg: RunConfig) -> EarlyStop:
        return cls(cfg.early_stop.patience, cfg.early_stop.min_delta)

    @property
    def enabled(self) -> bool:
        return self.patience > 0

    def update(self, step: int, val_loss: float) -> bool:
        """Count one validation; True when it is a new best."""
        if self.best_val_loss is None or val_loss < self.best_val_loss - self.min_delta:
            self.best_step, self.best_val_loss, self.since_best = step, val_loss, 0
            return True
        self.since_best += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.enabled and self.since_best >= self.patience

    def state_dict(self) -> dict:
        """Its part of trainer_state.json (trainer/loop/parts.py)."""
        return {"early_stop": {"best_step": self.best_step, "best_val_loss": self.best_val_loss,
                               "since_best": self.since_best}}

    def load_state_dict(self, state: dict) -> None:
        """From a checkpoint's trainer_state.json; one written before early stop existed counts from nothing."""
        mine = state.get("early_stop")
        if mine:
            self.best_step, self.best_val_loss = mine.get("best_step"), mine.get("best_val_loss")
            self.since_best = int(mine.get("since_best", 0))


def probe_batches(cfg: RunConfig) -> list:
    """The fixed validation rows of [eval] probe's val split (packed windows of a text corpus, padded rows of a
    chat corpus), or [] without a probe. Its vocabulary must be the model's. Only the val split is opened (its
    files checked against meta.json): under a supervisor from its staged copy in scratch (eval.probe_staged),
    which holds nothing else; the train split is never mapped nor scanned."""
    from minilmd.corpus.format import TokenStream
    from minilmd.corpus_meta import CorpusError, data_format_of, read_meta
    from minilmd.names import SPLITS
    from minilmd.plan.samplers import validation_batches

    if not cfg.eval.probe:
        return []
    root = Path(cfg.eval.probe_staged or cfg.eval.probe)
    meta = read_meta(root)
    vocab = meta.get("vocab_size")
    if vocab != cfg.model.vocab_size:
        raise ConfigError([f"eval.probe = {cfg.eval.probe!r} was tokenized with a vocabulary of {vocab}, "
                           f"the model has {cfg.model.vocab_size}"], cfg.source)
    val = TokenStream(root / SPLITS[1], cfg.model.vocab_size)
    want = meta.get("splits", {}).get(SPLITS[1], {})
    if want.get("tokens") != val.n_tokens or want.get("documents") != val.n_docs:
        raise CorpusError(f"{val.dir}: {val.n_docs} documents / {val.n_tokens} tokens but meta.json records "
                          f"{want.get('documents')} / {want.get('tokens')}")
    mode = "padded" if data_format_of(meta) == "chat" else "packed"
    return validation_batches(mode, val.tokens, val.doc_starts, cfg.train.seq_len, cfg.data.val_windows,
                              cfg.train.micro_batch_size, val.loss_mask, cfg.data.doc_mask and mode == "packed")
