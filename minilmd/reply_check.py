"""The config check's count of what train.seq_len cuts away of a prepared corpus's replies (minilmd/replycut.py
replies_cut), kept apart from the corpus's other checks (probes.py _check_prepared_dir): it reads the index and up
to SAMPLE_DOCS conversations per split, so it gets its own bound (COUNT_BOUND_S), and a count that does not
answer in time, or cannot read the corpus's files (unreadable, failing, truncated), leaves every other corpus problem
said and ends in a note naming why, never in silence nor in a refusal. Counted once a process for a corpus, the
settings that shape its rows and the files it read as they were (`run --check` asks twice, for the problem and then
for the note; a launch once): a later ask reuses the verdict while meta.json and each file the count read are the
same (_verdicts), and a count still running when its bound ends is kept, its thread and its answer: a later ask
waits on it for what is left of its bound, never starts another (_counts: one count at a time reads a corpus). The
trainer counts no sample: it decides on its own exact count at its start (plan/bucketing.py check_replies_fit)."""
from __future__ import annotations

import copy
import json
import os
import threading
import time
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
next ask reuses the verdict, and one back gives identities again, and a fresh count when they changed."""
_verdicts: dict[tuple, tuple[tuple[str, ...], object, tuple[str, str]]] = {}
"""{(count version, corpus, row settings, meta.json): (the files the count read, their identities, its verdict)}.
Kept in this process's memory alone, never in a file: nothing another user or run could write or plant is ever read
back as a count (so none of the hostile-file rules has a file to guard). A verdict is reused only while each file it
read is the same file unchanged (replycut.file_identity: a corpus rewritten in place under the same meta.json is
counted again)."""


class _Count:
    """One count of a corpus in a thread of its own (a daemon: a count on a stalled share is left behind), bounded
    by COUNT_BOUND_S from its start in all: the asks that wait on it share that bound."""

    def __init__(self, key: tuple, replies_cut, cfg: RunConfig, meta: dict):
        self.key = key
        self.seen: Seen = {}
        self.found: list[tuple[tuple[str, str], str]] = []
        self.ends = time.monotonic() + COUNT_BOUND_S
        self.thread = threading.Thread(target=lambda: self.found.append(
            _count_or_why(replies_cut, cfg, meta, self.seen)), daemon=True)
        self.thread.start()

    def answered(self) -> bool:
        """Whether the count answered, waiting for what is left of its bound."""
        self.thread.join(max(0.0, self.ends - time.monotonic()))
        return bool(self.found)

    def keep(self) -> tuple[str, str]:
        """The verdict of a count that answered, kept in _verdicts with the files it read."""
        found, why = self.found[0]
        verdict = ("", not_read(why)) if why else found
        read = dict(self.seen)
        _verdicts[self.key] = (tuple(read), _identities_of(read), verdict)
        return verdict


_counts: dict[str, _Count] = {}
"""{corpus (data.prepared): its count that did not answer within its bound}: kept so that a later ask waits on it, or
takes its answer, rather than start a count beside it (bounded: one thread at a time reads a corpus)."""


def replies_verdict(cfg: RunConfig, meta: dict) -> tuple[str, str]:
    """(problem, warning) of replycut.replies_cut for the corpus whose meta.json is `meta`, within its own bound:
    ("", not_counted()) when it does not answer in time, ("", not_read(...)) when its files cannot be read now (the
    trainer counts again). Once a process for the same corpus, meta.json, row settings and files (_verdicts); a
    count that did not answer is waited on by a later ask, never started again beside itself (_counts)."""
    from minilmd.replycut import COUNT_VERSION, replies_cut  # numpy: only where a corpus is counted

    trained = copy.deepcopy(cfg)
    apply_stage_defaults(trained, "chat")  # what replies_cut counts at: the rows as trained
    key = (COUNT_VERSION, cfg.data.prepared, cfg.train.seq_len, trained.train.seq_len, trained.data.mode,
           trained.data.doc_mask, json.dumps(meta, sort_keys=True, default=repr))
    corpus = cfg.data.prepared
    count = _counts.get(corpus)
    if count is not None and not count.thread.is_alive():  # it ended since: its answer is kept as any other's
        del _counts[corpus]
        if count.found:
            count.keep()
        count = None
    kept = _verdicts.get(key)
    if kept is not None and _identities_now(kept[0]) == kept[1]:
        return kept[2]
    if count is None:
        count = _counts[corpus] = _Count(key, replies_cut, cfg, meta)
    elif count.key != key:  # a count at other settings still reads this corpus: not another beside it
        return "", not_counted()
    if not count.answered():
        return "", not_counted()
    del _counts[corpus]
    return count.keep()


def _count_or_why(replies_cut, cfg: RunConfig, meta: dict, seen: Seen) -> tuple[tuple[str, str], str]:
    """(replies_cut's verdict, ""), or (("", ""), why) when it cannot read a file now (its words name the file), or
    when the count itself fails: said as what it is, never as a count that did not answer (review10b 2; before, the
    thread died with a traceback and the note said the count had not answered in time)."""
    try:
        return replies_cut(cfg, meta, seen), ""
    except OSError as e:
        return ("", ""), str(e)
    except Exception as e:  # noqa: BLE001 - a note, never a refusal: the trainer counts exactly at its start
        return ("", ""), f"{cfg.data.prepared}: the count failed ({type(e).__name__}: {e})"


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
    if not answered or not isinstance(meta, dict):
        return ""
    problem, warning = replies_verdict(cfg, meta)
    # a problem here is a count that answered after the check's ask had said it not counted (that check passed)
    return not_counted() if problem else warning
