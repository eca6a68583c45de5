"""The config check's count of what train.seq_len cuts away of a prepared corpus's replies (minilmd/replycut.py
replies_cut), kept apart from the corpus's other checks (probes.py _check_prepared_dir): it reads the index and up
to SAMPLE_DOCS conversations per split, so it gets its own bound (COUNT_BOUND_S), and a count that does not
answer in time leaves every other corpus problem said and ends in a note, never in silence. Counted once a process
for a corpus and the settings that shape its rows (`run --check` asks for the problem and then the note; a
supervisor asks again at each restart and recounts only a changed meta.json). The trainer counts no sample: it
decides on its own exact count at its start (plan/bucketing.py check_replies_fit)."""
from __future__ import annotations

import copy
import json

from minilmd.bounded import SHARED_STORAGE_PROBE_S, bounded_probe
from minilmd.config import RunConfig, apply_stage_defaults
from minilmd.corpus_meta import read_corpus_meta
from minilmd.urls import is_url

COUNT_BOUND_S = SHARED_STORAGE_PROBE_S
"""Seconds the count may take (both splits), apart from the corpus probe's own."""


def not_counted() -> str:
    """The note of a count that did not answer within COUNT_BOUND_S."""
    return (f"the replies train.seq_len cuts away were not counted here (the count did not answer within "
            f"{COUNT_BOUND_S:g} s): the trainer counts them at its start, and refuses the run there past half of the "
            f"train split's reply tokens")


_verdicts: dict[tuple, tuple[str, str]] = {}


def replies_verdict(cfg: RunConfig, meta: dict) -> tuple[str, str]:
    """(problem, warning) of replycut.replies_cut for the corpus whose meta.json is `meta`, within its own bound:
    ("", not_counted()) when it does not answer in time, ("", "") when its files cannot be read now (the trainer
    counts again). Once a process for the same corpus, meta.json and row settings."""
    from minilmd.replycut import replies_cut  # numpy: only where a corpus is counted

    trained = copy.deepcopy(cfg)
    apply_stage_defaults(trained, "chat")  # what replies_cut counts at: the rows as trained
    key = (cfg.data.prepared, cfg.train.seq_len, trained.train.seq_len, trained.data.mode, trained.data.doc_mask,
           json.dumps(meta, sort_keys=True, default=repr))
    if key not in _verdicts:
        answered, found, why = bounded_probe(replies_cut, cfg, meta, timeout_s=COUNT_BOUND_S)
        _verdicts[key] = found if answered else ("", not_counted() if why.startswith("did not answer") else "")
    return _verdicts[key]


def replies_cut_warning(cfg: RunConfig) -> str:
    """What train.seq_len cuts away of a local corpus's replies when it is not refused (replies_verdict's warning,
    or the note that it was not counted here): a line for `run --check`; "" when none, or unreadable now."""
    if not cfg.data.prepared or is_url(cfg.data.prepared):
        return ""
    answered, meta, _ = bounded_probe(read_corpus_meta, cfg.data.prepared)
    return replies_verdict(cfg, meta)[1] if answered and isinstance(meta, dict) else ""
