"""Early stopping on a validation metric (the val loss, or a DPO run's val reward accuracy), and the retention probe
evaluated beside it.

`EarlyStop` follows early_stop.metric at every validation (every train.eval_every steps and at each epoch's end):
a new best (beyond the best by more than early_stop.min_delta: below it for the val loss, above it for the reward
accuracy) resets the count; `patience` validations in a row without one stop the run cleanly (exit 0, like a
finished budget). Its state travels in trainer_state.json (a part with state_dict/load_state_dict,
trainer/loop/parts.py), so a resumed run counts on where it left off. The trainer keeps the checkpoint of each new
best (BEST, which pruning, the sync and the remote's retention keep besides the newest, and which `init.checkpoint =
"best"` of a later stage takes).

`probe_batches`: the val split of an earlier stage's prepared corpus ([eval] probe), whose loss shows forgetting.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minilmd.config import ConfigError, RunConfig
from minilmd.config_sections import EARLY_STOP_METRICS
from minilmd.config_values import early_stop_metric_problem


@dataclass
class EarlyStop:
    patience: int
    """0: never stop (the best is still followed, for the metrics)."""
    min_delta: float
    metric: str = "val_loss"
    """The validation's field followed (early_stop.metric: EARLY_STOP_METRICS says which way is better)."""
    best_step: int | None = None
    best_value: float | None = None
    since_best: int = 0
    """Validations since the best one."""

    @classmethod
    def from_config(cls, cfg: RunConfig, data_format: str = "text") -> EarlyStop:
        """For a run on a corpus of `data_format`; ConfigError (final) for a metric that corpus cannot give."""
        if problem := early_stop_metric_problem(cfg, data_format):
            raise ConfigError([problem], cfg.source)
        return cls(cfg.early_stop.patience, cfg.early_stop.min_delta, cfg.early_stop.metric)

    @property
    def enabled(self) -> bool:
        return self.patience > 0

    @property
    def higher_is_better(self) -> bool:
        return EARLY_STOP_METRICS[self.metric] == "higher"

    def update(self, step: int, validation: dict[str, float]) -> bool:
        """Count one validation (its fields: val_loss and the objective's val_* metrics); True when it is a new
        best of the metric."""
        value = float(validation[self.metric])
        best = self.best_value
        if best is None or (value > best + self.min_delta if self.higher_is_better else value < best - self.min_delta):
            self.best_step, self.best_value, self.since_best = step, value, 0
            return True
        self.since_best += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.enabled and self.since_best >= self.patience

    def best_fields(self) -> dict:
        """The best so far as metrics.jsonl fields, of each eval line and the early_stop line: {"best_val_loss": ...}
        or {"best_val_reward_accuracy": ...}, and "best_step", the step that scored it (status names BEST by it;
        daemon/views/fitwatch.py)."""
        value = None if self.best_value is None else round(self.best_value, 6)
        return {f"best_{self.metric}": value, "best_step": self.best_step}

    def best_said(self) -> str:
        """"val_loss 1.2345 at step 200", for the trainer's lines."""
        return f"{self.metric} {self.best_value:.4f} at step {self.best_step}"

    def state_dict(self) -> dict:
        """Its part of trainer_state.json (trainer/loop/parts.py)."""
        return {"early_stop": {"metric": self.metric, "best_step": self.best_step, "best_value": self.best_value,
                               "since_best": self.since_best}}

    def load_state_dict(self, state: dict) -> None:
        """From a checkpoint's trainer_state.json. One written before early stop existed, or that followed another
        metric (the config changed it), counts from nothing; one from before early_stop.metric followed the val
        loss (its "best_val_loss")."""
        mine = state.get("early_stop")
        if not mine or mine.get("metric", "val_loss") != self.metric:
            return
        self.best_step = mine.get("best_step")
        self.best_value = mine.get("best_value", mine.get("best_val_loss"))
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
