"""`run --check`'s notes on how often the corpus is seen and on what validates it (user9 F11): a pretraining budget
of many epochs (154.84 epochs of a 388k-token corpus went by without a word; MiniMind's train_pretrain.py defaults
to 2 epochs, and a corpus seen tens of times is memorised, not learnt from), and a val split shorter than one
training window (its validation loss is one short row: plan/samplers.py validation_batches). Notes, not refusals:
a tiny corpus trained on purpose (a test, a demo) is legitimate. Torch-free."""
from __future__ import annotations

from typing import Any

from minilmd.config import RunConfig
from minilmd.corpus_meta import data_format_of, meta_value
from minilmd.plan.budget import Planned

MANY_PRETRAIN_EPOCHS = 20.0
"""Above this many epochs of a pretraining (text) corpus, `run --check` notes it: MiniMind pretrains 1-2."""


def epoch_notes(cfg: RunConfig, plan: Planned | None, meta: dict[str, Any] | None) -> list[str]:
    """The notes (module docstring); [] where the corpus does not say its size."""
    if not meta:
        return []
    notes = []
    epochs = plan.epochs if plan is not None else None
    if data_format_of(meta) == "text" and epochs is not None and epochs > MANY_PRETRAIN_EPOCHS:
        notes.append(f"the budget is {epochs:,.1f} epochs of a pretraining corpus: the corpus is seen "
                     f"{epochs:,.0f} times (MiniMind pretrains 1-2 epochs); a model that sees its corpus this often "
                     f"memorises it: a smaller budget (train.max_epochs = 2) or a larger corpus")
    val_tokens = meta_value(meta, "splits", "val", "tokens")
    if (data_format_of(meta) == "text" and cfg.data.mode == "packed" and isinstance(val_tokens, int)
            and not isinstance(val_tokens, bool) and 2 <= val_tokens < cfg.train.seq_len):
        notes.append(f"the val split holds {val_tokens:,} tokens, shorter than one window (train.seq_len = "
                     f"{cfg.train.seq_len:,}): the validation loss is one row of {val_tokens:,} tokens, noisy, and "
                     f"early stopping and the overfitting warnings read it; prepare the corpus again with a larger "
                     f"--val-fraction")
    return notes
