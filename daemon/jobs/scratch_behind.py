"""A start whose scratch holds checkpoints, but older ones than run.remote: the remote's newer one is taken.

A run whose run.dir is on a shared home trains on machine A (scratch /dev/shm, synced step 20), moves to machine B
(empty scratch: it fetches 20, trains to 50, syncs 50), then comes back to A, whose /dev/shm still holds step 20 (or
25, never synced); or systemd restarts it on A after someone ran it on B. A start resumed from scratch whenever it
held a checkpoint: 30 steps computed again in silence, and the later syncs put a second history's steps on top of
B's 50 (a forked lineage on the remote). Now `judge` decides, for `run --check` (daemon/jobs/resumefrom.py) and
staging (`fetch_over_scratch`, daemon/jobs/stagingworker.py) alike, the one rule of both:

- the remote's newest valid checkpoint, as the fetch would take it (fetch.py peek_latest: bounded, from the root's
  descriptor, its trainer_state checked against the run's Expectation), is a newer step than scratch's newest valid
  one (or scratch holds no valid one): staging fetches it into scratch beside scratch's (never deleted by this;
  the trainer's find_latest takes the newer), downloaded, hashed and validated as any fetched step;
- both are a DPO run's step 0 and the remote's carries a stopped reference pass further on than scratch's
  (daemon/jobs/pass_resume.py: another machine's later stop): staging fetches it in place of scratch's;
- that remote checkpoint is of another model, corpus or tokenizer: refused, as the fetch refuses one (`refused`);
- scratch's is as new or newer (unsynced steps): scratch's, as ever; the sync copies them up later;
- the remote cannot be looked at now (not answering within SHARED_STORAGE_PROBE_S, EIO, a store that cannot be
  opened): scratch's (no wait: it has a checkpoint to go on from), and said (`unlooked`), since the remote was not
  compared; unless an earlier try this staging saw a newer step there (`known`): then the start waits, as below.
  A remote claimed by another run is not looked at (the launch's claim check refuses it).

A newer remote step whose fetch fails for a reason that can pass (an EIO, scratch full: `wait`) is never given up
for scratch's older one, whose later syncs would write a second history over the remote's: staging retries the
fetch with backoff, as it retries the fetch into an empty scratch (`waiting_remote` in status). One that does not
validate when fetched is set aside as the fetch sets any aside, and the next newer-than-scratch step is tried, else
scratch's, said (`set_aside`).
Torch-free: numpy is imported only where a checkpoint is read.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd.checkpoint_contents import further_pass
from minilmd.names import step_of, step_or_none
from minilmd.probes import bounded_probe

if TYPE_CHECKING:
    from minilmd.checkpoint import CheckpointMismatch, Expectation
    from minilmd.daemon.jobs.pass_resume import FurtherPass
    from minilmd.daemon.jobs.sync import Syncer


@dataclass(frozen=True)
class Taken:
    """The remote checkpoint a start takes over scratch's."""

    name: str
    """Its step's name on the remote."""
    held: int | None
    """Scratch's newest valid step (None: scratch holds no valid checkpoint)."""
    further: FurtherPass | None = None
    """Set when both are step 0 and the remote's reference pass is further on (fetched in place of scratch's)."""
    passed: list[str] = field(default_factory=list)
    """Newer remote checkpoints the peek passed by as invalid, one line each."""

    @property
    def step(self) -> int:
        return step_of(self.name)

    def words(self) -> str:
        """Why, for the fetch's event and supervisor.log: `scratch held step 20; run.remote holds step 50, newer`."""
        if self.further is not None:
            return self.further.words()
        held = "no valid checkpoint" if self.held is None else f"step {self.held}"
        return f"scratch held {held}; run.remote holds step {self.step}, newer"

    def check_words(self) -> str:
        """Why and what staging does, for `run --check`'s start line."""
        if self.further is not None:
            return f"{self.further.words()}; staging fetches it in place of scratch's"
        held = "scratch holds no valid checkpoint" if self.held is None else \
            f"newer than scratch's step {self.held}"
        return f"{held}; staging fetches it beside scratch's"


@dataclass(frozen=True)
class Verdict:
    """`judge`'s answer: at most one of them set; none: scratch's, as ever."""

    taken: Taken | None = None
    refused: CheckpointMismatch | None = None
    """The remote's newer checkpoint, of another model, corpus or tokenizer."""
    unlooked: str = ""
    """Why the remote could not be compared now, in the words said to the user."""
    wait: str = ""
    """Why the start waits (fetch_over_scratch): the remote's newer step `newer` could not be fetched now, for a
    reason that can pass; staging retries the fetch."""
    newer: int | None = None
    """With `wait`: the remote's newer step, `known` to the retry."""
    scratch_full: bool = False
    """With `wait`: scratch had no room for it (ENOSPC, EDQUOT), rather than the remote failing."""
    set_aside: tuple[str, ...] = ()
    """Newer remote steps that did not validate when fetched (set aside), one line each, to be said."""
    why: str = field(default="", compare=False)
    """With `unlooked`: why the remote could not be looked at, alone."""


def judge(syncer: Syncer, checkpoint_dir: Path, held: int | None, skip: frozenset[str] = frozenset()) -> Verdict:
    """The rule (module docstring). `held`: scratch's newest valid step (`scratch_newest`), None for none. `skip`:
    remote steps a fetch found invalid just now, passed by."""
    answered, peeked, why = bounded_probe(peek, syncer, skip, says_why=True)
    if answered and peeked[0] == "failed":
        answered, why = False, f"cannot be opened ({peeked[1]})"
    if not answered:
        return Verdict(unlooked=_unlooked_words(syncer.remote_url, why, held), why=why)
    outcome, value, passed = peeked
    if outcome == "refused":
        newer = step_or_none(Path(value.path).name)
        return Verdict(refused=value) if held is None or newer is None or newer > held else Verdict()
    if value is None:
        return Verdict()
    if held is None or step_of(value) > held:
        return Verdict(Taken(value, held, passed=passed))
    if step_of(value) == held == 0:
        from minilmd.daemon.jobs.pass_resume import FurtherPass, scratch_pass

        scratch = scratch_pass(checkpoint_dir)
        found = bounded_probe(lambda: syncer.remote.read_manifest(value).manifest)[1] if scratch is not None else None
        if scratch is not None and isinstance(found, dict) and further_pass(found, scratch):
            return Verdict(Taken(value, held, FurtherPass(scratch, found), passed))
    return Verdict()


def _unlooked_words(url: str, why: str, held: int | None) -> str:
    start = f"the start goes on from scratch's step {held}" if held is not None else \
        "the start goes on from step 0 (no checkpoint in scratch is valid)"
    return (f"run.remote {url} {why}: not compared with scratch, and {start} without knowing whether another machine "
            f"trained this run further and synced it there; if one did, stop this run and start it again once the "
            f"remote answers, or it computes those steps again and syncs a second history over them")


def peek(syncer: Syncer, skip: frozenset[str] = frozenset()) -> tuple[str, object, list[str]]:
    """The fetch's choice (peek_latest), for a probe's thread: ("found", the step's name or None, passed by),
    ("refused", the CheckpointMismatch, []), or ("failed", why, []) for an error other than an OSError (which
    bounded_probe takes as no answer): never raised out of the thread, where it would be lost. A remote claimed by
    another run is not looked at (the launch's claim check refuses it): ("found", None, [])."""
    from minilmd.checkpoint import CheckpointMismatch  # numpy: only where a checkpoint is read

    try:
        if syncer._claim_refused():
            return "found", None, []
        name, passed = syncer.peek_latest(skip)
        return "found", name, passed
    except CheckpointMismatch as e:
        return "refused", e, []
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - a store that cannot be opened: the sync and the fetch say so
        return "failed", f"{type(e).__name__}: {e}", []


def scratch_newest(checkpoint_dir: Path, expected: Expectation | None) -> int | None:
    """Scratch's newest valid step, as the trainer's resume finds it (find_latest, nothing moved); None when none
    validates. CheckpointMismatch when it is of another model, corpus or tokenizer."""
    from minilmd.checkpoint_select import find_latest

    path = find_latest([checkpoint_dir], expected, log=lambda _: None, set_aside=False, reuse=True)
    return step_of(path) if path is not None else None


def fetch_over_scratch(syncer: Syncer, checkpoint_dir: Path, expected: Expectation | None,
                       known: int | None = None) -> Verdict:
    """Staging's side: `judge`, and the remote checkpoint it takes fetched into scratch (Syncer.fetch_step; a step 0
    only while the remote's manifest is still further on than scratch's). Its Verdict: `wait` when that fetch failed
    for a reason that can pass, or when the remote cannot be looked at now but an earlier try saw its newer step
    `known` (module docstring); one that did not validate (set aside, as any fetch does) is passed by for the next
    newer one, else scratch's, and listed in `set_aside`. Raises the refused CheckpointMismatch (final, as the
    fetch's own)."""
    from minilmd.checkpoint import CheckpointMismatch

    try:
        held = scratch_newest(checkpoint_dir, expected)
    except CheckpointMismatch:
        return Verdict()  # scratch's own is another model's: the trainer refuses it, in its words
    skip: set[str] = set()
    set_aside: list[str] = []
    while True:  # each turn passes one more remote step by: as many turns as the remote has newer steps
        verdict = judge(syncer, checkpoint_dir, held, frozenset(skip))
        if verdict.refused is not None:
            raise verdict.refused
        if verdict.unlooked and known is not None and (held is None or known > held):
            return Verdict(wait=f"run.remote {syncer.remote_url} {verdict.why}, and it held step {known}, newer than "
                                f"{_held_words(held)} when last looked at", newer=known)
        if (taken := verdict.taken) is None:
            return replace(verdict, set_aside=tuple(set_aside))
        further = taken.further
        only_if = functools.partial(_further, held=further.held) if further is not None else (lambda m: True)
        try:
            fetched = syncer.fetch_step(taken.name, checkpoint_dir, only_if)
        except CheckpointMismatch:
            raise
        except Exception as e:  # noqa: BLE001 - an EIO, a stall cut, scratch full: it may pass, so wait for it
            from minilmd.daemon.base.runstate import is_disk_full

            return Verdict(wait=f"{taken.words()}, but it could not be fetched ({e})", newer=taken.step,
                           scratch_full=any(is_disk_full(c) for c in _causes(e)))
        if fetched is not None:
            return replace(verdict, set_aside=tuple(set_aside))
        skip.add(taken.name)
        set_aside.append(f"run.remote's step {taken.step} ({syncer.remote.show(taken.name)}), newer than "
                         f"{_held_words(held)}, was not taken: it did not validate when fetched (set aside there, or "
                         f"skipped: supervisor.log says why) or changed since it was looked at")
        syncer.log(f"sync: {set_aside[-1]}")


def _held_words(held: int | None) -> str:
    return f"scratch's step {held}" if held is not None else "scratch's (none valid)"


def _further(manifest: dict, held) -> bool:
    return further_pass(manifest, held)


def _causes(e: BaseException | None):
    """`e` and what it was raised from (the fetch's SyncError wraps the OSError), a bounded chain."""
    for _ in range(8):
        if e is None:
            return
        yield e
        e = e.__cause__ or e.__context__
