"""trainer_state.json's run-position keys and the one rule that reads the rows a checkpoint trained on, for the
trainer's resume (trainer/loop/parts.py TrainState), a resume on a grown corpus (growth.py), and what a resumed
checkpoint trained (`Trained`), which every count of a run's budget takes as plan/budget.py `planned`'s `done`: the
trainer, `run --check`'s budget and update share lines (update_share.py) and `corpus report --config`
(model_budget.py). Torch-free.

`rows_seen` is what a checkpoint records since 2026-12-01; an older one records its `step` and the `global_batch`
it trained with (every checkpoint has): the rows it saw are their product. Not the global batch a resume runs with
now: resuming a 10-step checkpoint of global batch 4 at global batch 8 has seen 40 rows, not 80 (a resume went on
from row 80 and skipped 40 rows of the epoch), and not 0 (a corpus grown since then put the new documents in the
wrong epoch)."""
from __future__ import annotations

from dataclasses import dataclass

from minilmd.batch_stream import TRAINED

STEP = "step"
"""The optimizer steps done: written by the checkpoint writer (trainer/checkpoint/save.py), its one writer."""
ROWS_SEEN = "rows_seen"
"""The rows trained on up to the checkpoint, over all ranks."""
TOKENS_SEEN = "tokens_seen"
POSITIONS_SEEN = "positions_seen"
"""The token positions trained on (rows x the seq_len each was cut at, padding and each side of a pair counted as
the budget counts them: train.max_tokens), over all ranks; since 2026-12-06. An older checkpoint's: its rows times
the seq_len its recorded config has (`trained`)."""
GLOBAL_BATCH = "global_batch"
"""Rows per optimizer step of the attempt that wrote the checkpoint."""


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def rows_seen(state: dict, global_batch_now: int | None = None) -> int | None:
    """The rows the checkpoint whose trainer_state is `state` trained on: its `rows_seen`, else its step times the
    global batch it recorded (a checkpoint from before rows_seen), else (no global batch recorded either) its step
    times `global_batch_now`; None when the state does not say (no step, or a value that is no count)."""
    rows = _count(state.get(ROWS_SEEN))
    if rows is not None:
        return rows
    step = _count(state.get(STEP))
    batch = _count(state.get(GLOBAL_BATCH))
    batch = batch if batch is not None else global_batch_now
    return step * batch if step is not None and batch is not None else None


@dataclass(frozen=True)
class Trained:
    """What a checkpoint's run has trained, as its budget counts it: `step` optimizer steps, `rows` rows and
    `positions` token positions. A budget in tokens or epochs is what these leave of it at today's batch
    (plan/budget.py budget_steps), not the global step at today's batch: a resume with another micro-batch ends
    when the tokens or epochs are trained."""

    step: int
    rows: int
    positions: int


def trained(state: dict, global_batch_now: int | None = None, seq_len_now: int | None = None) -> Trained | None:
    """What the checkpoint whose trainer_state is `state` trained (Trained): its rows (rows_seen's rule) and its
    `positions_seen`, else those rows times the seq_len its recorded config has (a checkpoint from before
    positions_seen), else times `seq_len_now`; None when the state does not say."""
    step = _count(state.get(STEP)) if isinstance(state, dict) else None
    rows = rows_seen(state, global_batch_now) if step is not None else None
    if step is None or rows is None:
        return None
    positions = _count(state.get(POSITIONS_SEEN))
    if positions is None:
        config = state.get("config")
        train = config.get("train") if isinstance(config, dict) else None
        seq_len = _count(train.get("seq_len")) if isinstance(train, dict) else None
        seq_len = seq_len if seq_len is not None else seq_len_now
        if seq_len is None:
            return None
        positions = rows * seq_len
    return Trained(step, rows, positions)


def recorded_trained(recorded) -> Trained | None:
    """What a checkpoint trained (`trained`), from its batch_stream.stream_record (which `run --check` reads, in
    scratch or on the remote); None when it does not say."""
    raw = recorded.get(TRAINED) if isinstance(recorded, dict) else None
    return trained({**raw, "config": recorded}) if isinstance(raw, dict) else None


def scratch_trained(cfg) -> Trained | None:
    """What the newest checkpoint in the run's own scratch (cfg.checkpoint_dir: names only, nothing validated)
    records it trained, read as `run --check` reads it (batch_stream.recorded_config, recorded_trained); None for a
    run with none there, or none readable. For a view with no resume worked out (`corpus report --config`): the
    launch's own choice, which may take the remote's newer checkpoint, is daemon/jobs/resumefrom.py's."""
    from minilmd.batch_stream import recorded_config
    from minilmd.checkpoint_dirs import list_checkpoints
    from minilmd.scratch_root import RecordUnreadable

    try:
        newest = list_checkpoints(cfg.checkpoint_dir)[-1:]
    except (OSError, RecordUnreadable):  # no scratch yet; where it is cannot be known now
        return None
    return recorded_trained(recorded_config(newest[0])) if newest else None
