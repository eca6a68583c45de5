"""The config check's count of what train.seq_len cuts away of a prepared corpus's replies (minilmd/replycut.py
replies_cut), kept apart from the corpus's other checks (probes.py _check_prepared_dir): it reads the index and up
to SAMPLE_DOCS conversations per split, so it gets its own bound (COUNT_BOUND_S), and a count that does not
answer in time, or cannot read the corpus's files (unreadable, failing, truncated), leaves every other corpus problem
said and ends in a note naming why, never in silence nor in a refusal. Counted once a process for a corpus, the
settings that shape its rows and the files it read as they were (`run --check` asks for the problem and then the
note; a supervisor asks again at each restart and recounts a changed meta.json, or a file the count read that is
another or was rewritten since: _verdicts). The trainer counts no sample: it decides on its own exact count at its
start (plan/bucketing.py check_replies_fit)."""
from __future__ import annotations

import copy
import json
import os
from typing import TYPE_CHECKING

from minilmd.bounded import SHARED_STORAGE_PROBE_S, bounded_probe
from minilmd.config import RunConfig, apply_stage_defaults
from minilmd.corpus_meta import read_corpus_meta
from minilmd.urls import is_url

if TYPE_CHECKING:
    from minilmd.replycut import Seen

COUNT_BOUND_S = SHARED_STORAGE_PROBE_S
"""Seconds the count may take (both splits), apart from the corpus probe's own."""


TRAINER_COUNTS = ("the trainer counts them exactly at its start, and refuses the run there past half of the train "
                  "split's reply tokens")


def not_counted() -> str:
    """The note of a count that did not answer within COUNT_BOUND_S."""
    return (f"the replies train.seq_len cuts away were not counted here (the count did not answer within "
            f"{COUNT_BOUND_S:g} s): {TRAINER_COUNTS}")


def not_read(why: str) -> str:
    """The note of a count that could not read the corpus's files (`why`: which, and what failed)."""
    return f"the replies train.seq_len cuts away were not counted here, a file could not be read: {why}; " + \
        TRAINER_COUNTS


STALLED = "did not answer"
"""The identities of files that a look could not reach in time: equal to themselves, so a share still stalled at the
next ask reuses the note, and one back gives identities again, and a fresh count."""
_verdicts: dict[tuple, tuple[tuple[str, ...], object, tuple[str, str]]] = {}
"""{(count version, corpus, row settings, meta.json): (the files the count read, their identities, its verdict)}.
Kept in this process's memory alone, never in a file: nothing another user or run could write or plant is ever read
back as a count (so none of the hostile-file rules has a file to guard). A verdict is reused only while each file it
read is the same file unchanged (replycut.file_identity: a corpus rewritten in place under the same meta.json is
counted again)."""


def replies_verdict(cfg: RunConfig, meta: dict) -> tuple[str, str]:
    """(problem, warning) of replycut.replies_cut for the corpus whose meta.json is `meta`, within its own bound:
    ("", not_counted()) when it does not answer in time, ("", not_read(...)) when its files cannot be read now (the
    trainer counts again). Once a process for the same corpus, meta.json, row settings and files (_verdicts)."""
    from minilmd.replycut import COUNT_VERSION, replies_cut  # numpy: only where a corpus is counted

    trained = copy.deepcopy(cfg)
    apply_stage_defaults(trained, "chat")  # what replies_cut counts at: the rows as trained
    key = (COUNT_VERSION, cfg.data.prepared, cfg.train.seq_len, trained.train.seq_len, trained.data.mode,
           trained.data.doc_mask, json.dumps(meta, sort_keys=True, default=repr))
    kept = _verdicts.get(key)
    if kept is not None and _identities_now(kept[0]) == kept[1]:
        return kept[2]
    seen: Seen = {}
    answered, found, _ = bounded_probe(_count_or_why, replies_cut, cfg, meta, seen, timeout_s=COUNT_BOUND_S)
    read = dict(seen)  # a count that did not answer may go on filling `seen`
    verdict = ("", not_counted()) if not answered else ("", not_read(found[1])) if found[1] else found[0]
    # a count that did not answer found the share stalled: its files are looked at again at the next ask, not now
    _verdicts[key] = (tuple(read), _identities_of(read) if answered else STALLED, verdict)
    return verdict


def _count_or_why(replies_cut, cfg: RunConfig, meta: dict, seen: Seen) -> tuple[tuple[str, str], str]:
    """(replies_cut's verdict, ""), or (("", ""), why) when it cannot read a file now (its words name the file)."""
    try:
        return replies_cut(cfg, meta, seen), ""
    except OSError as e:
        return ("", ""), str(e)


def _identities_of(read: Seen) -> object:
    """The identities of the files a count read: of each file it opened, as it opened it (fstat: the very file
    read); of one it could not open, as a look finds it now. STALLED when that look does not answer."""
    if all(identity is not None for identity in read.values()):
        return tuple(read.values())
    now = _identities_now(tuple(read))
    if not isinstance(now, tuple):
        return now
    return tuple(then if then is not None else looked for then, looked in zip(read.values(), now, strict=True))


def _identities_now(paths: tuple[str, ...]) -> object:
    """Each path's identity as a look (lstat: no link followed, nothing opened) finds it now, or its error; STALLED
    when the look does not answer within COUNT_BOUND_S (a stalled share)."""
    if not paths:
        return ()
    answered, found, _ = bounded_probe(_look, paths, timeout_s=COUNT_BOUND_S)
    return found if answered else STALLED


def _look(paths: tuple[str, ...]) -> tuple:
    from minilmd.replycut import file_identity

    looked: list = []
    for path in paths:
        try:
            looked.append(file_identity(os.lstat(path)))
        except OSError as e:
            looked.append(f"errno {e.errno}")
    return tuple(looked)


def replies_cut_warning(cfg: RunConfig) -> str:
    """What train.seq_len cuts away of a local corpus's replies when it is not refused (replies_verdict's warning,
    or the note that it was not counted here, and why): a line for `run --check`; "" when none, or when meta.json
    cannot be read now (the corpus checks say that)."""
    if not cfg.data.prepared or is_url(cfg.data.prepared):
        return ""
    answered, meta, _ = bounded_probe(read_corpus_meta, cfg.data.prepared)
    return replies_verdict(cfg, meta)[1] if answered and isinstance(meta, dict) else ""
