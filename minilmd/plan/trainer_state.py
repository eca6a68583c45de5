"""trainer_state.json's run-position keys and the one rule that reads the rows a checkpoint trained on, for the
trainer's resume (trainer/loop/parts.py TrainState), a resume on a grown corpus (growth.py) and `run --check`'s
update share (update_share.py). Torch-free.

`rows_seen` is what a checkpoint records since 2026-12-01; an older one records its `step` and the `global_batch`
it trained with (every checkpoint has): the rows it saw are their product. Not the global batch a resume runs with
now: resuming a 10-step checkpoint of global batch 4 at global batch 8 has seen 40 rows, not 80 (a resume went on
from row 80 and skipped 40 rows of the epoch), and not 0 (a corpus grown since then put the new documents in the
wrong epoch)."""
from __future__ import annotations

STEP = "step"
"""The optimizer steps done: written by the checkpoint writer (trainer/checkpoint/save.py), its one writer."""
ROWS_SEEN = "rows_seen"
"""The rows trained on up to the checkpoint, over all ranks."""
TOKENS_SEEN = "tokens_seen"
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
