"""The newest checkpoint a Slurm job's last sync could not put on run.remote, kept in run.dir until the remote has it.

A Slurm job's default scratch is the node's ($TMPDIR, /dev/shm) and the job's end may wipe it: a last sync that
cannot finish within the job (run.remote full, its owner record another's, for longer than
lastsynccut.FINAL_SYNC_WAIT_S) used to leave the run's newest checkpoint there, lost with the job, and the next start
trained its steps again from the remote's older one. run.dir is on shared storage and the run's own, so that
checkpoint is copied there, to `<run.dir>/unsynced/`, by the one way checkpoints are written out of scratch: a
`Syncer` whose remote is that directory (daemon/jobs/sync.py: each file made new, never through a link, from the
root's descriptor; read back against the manifest before it is renamed into place; what this run made recorded in
run.dir, in a record of its own, not run.remote's, and only that ever removed; one copy at most: retention keeps one;
run.dir itself never made: daemon/jobs/keptremote.py). A run.dir that is not there takes no copy (`run_dir_gone`):
removed while the run ran, the run ends as that rule says (daemon/phases/rundirwatch.py: exit 73, final).
The next start's staging fetches it back into scratch (`bring_back`: downloaded, hashed and validated as any fetch) when
it is newer than scratch's, before the remote's older one is looked at, so the trainer resumes from it and the ordinary
sync pushes it; once the remote holds that step it is removed (`drop_if_synced`: at the run's end, at a start whose
state.json records that step or a newer one synced, and as soon as a sync of the run that resumed from it pushes that
step or a newer one: daemon/aftersync.py), and `unsynced/` with it once empty (rmdir at run.dir's descriptor, only a
directory of this user's: nothing else there is ever removed).
A kept copy that does not verify is not resumed from: the fetch sets it aside into `unsynced/quarantine/`, which the
start says in one line (where, and why), and its record proves it this run's (daemon/jobs/keptremote.py). It is
removed as a good copy is, once run.remote holds its step or a newer one, and at the run's end when the trainer
ended done (whatever its step: nothing resumes from it again), with quarantine/, unsynced/'s LATEST and unsynced/
itself once nothing else is in them; one the record does not prove this run's is left, and said so at the quarantine.
Torch-free; the Syncer (numpy) is loaded only when a copy is made or read.
"""
from __future__ import annotations

import errno
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minilmd.bounded import bounded_probe
from minilmd.checkpoint_dirs import local_checkpoint_steps
from minilmd.names import KEPT_DIR, LATEST, QUARANTINE, step_name, step_or_none

KEEP_WAIT_S = 600.0
"""How long the copy into run.dir is waited for at the job's end (a checkpoint of a small model: seconds on a
working share); a run.dir that does not answer is left to its thread, and the job ends without the copy."""


ONE_AT_A_TIME = threading.Lock()
"""The copy, its fetch back and its removal run in threads of their own (the last sync's bounded probe, staging's,
the removal's: daemon/aftersync.py): one at a time, as when the loop made the removal itself between two ticks."""


@dataclass
class Kept:
    """What `keep` did: the step kept (None: none) and where, or why not."""

    step: int | None
    where: Path
    why_not: str = ""


def place(cfg) -> Path:
    return cfg.run_dir / KEPT_DIR


def _syncer(cfg, expected: Any):
    from minilmd.daemon.jobs.keptremote import KeptSyncer  # numpy: only when a checkpoint is copied

    return KeptSyncer(cfg.checkpoint_dir, cfg.run_dir, expected)


def run_dir_gone(run_dir: Path) -> str:
    """Why nothing may be made in run.dir now ("" when it may): it is not there (removed while the run ran: the
    removed-run.dir rule, daemon/phases/rundirwatch.py, ends the run, exit 73, final, and no copy makes it again),
    or its checked walk refuses it. run.dir is opened by that walk (dirfd.Dir.open), nothing made on the way."""
    from minilmd.dirfd import Dir

    try:
        with Dir.open(run_dir, "run.dir"):
            return ""
    except FileNotFoundError:
        return f"run.dir {run_dir} is not there (removed while the run ran?): nothing is made there"
    except (OSError, ValueError) as e:  # PlaceRefused (a ValueError), or it cannot be opened
        return f"run.dir {run_dir} cannot be opened ({e}): nothing is made there"


def _copy(cfg, expected: Any):
    """The copy into `<run.dir>/unsynced/`: the Syncer's SyncResult, or why run.dir takes none (words)."""
    with ONE_AT_A_TIME:
        if gone := run_dir_gone(cfg.run_dir):
            return gone
        return _syncer(cfg, expected).sync_newest()


def keep(cfg, expected: Any, remote_step: int | None, wait_s: float = KEEP_WAIT_S) -> Kept:
    """Scratch's newest checkpoint that validates, when the remote (its newest `remote_step`) lacks it, copied into
    `<run.dir>/unsynced/` (an older copy there removed: one at most). Kept(None, ...) with why when there is none
    to keep or the copy failed; the scratch is left as it is in any case."""
    where = place(cfg)
    local = max(local_checkpoint_steps(cfg.checkpoint_dir), default=None)
    if local is None or (remote_step is not None and local <= remote_step):
        return Kept(None, where, "run.remote has scratch's newest checkpoint")
    answered, result, why = bounded_probe(_copy, cfg, expected, timeout_s=wait_s, says_why=True)
    if not answered:
        return Kept(None, where, f"its copy into {where} failed: {why or 'no answer'}")
    if isinstance(result, str):
        return Kept(None, where, f"not copied into {where}: {result}")
    step = result.step
    if step is None or (remote_step is not None and step <= remote_step):
        return Kept(None, where, f"no checkpoint in {cfg.checkpoint_dir} newer than run.remote's validates")
    return Kept(step, where / step_name(step))


class Left(str):
    """The words of a removal that left the copy there because run.dir failed it (its listing or the removal raised:
    EIO, EACCES, ...), not because it refused: the caller that can try again does (daemon/aftersync.py)."""


def kept_step(cfg) -> int | None:
    """The step kept in run.dir, as its listing says (None: none; nothing opened but the directory)."""
    try:
        return _listed_step(cfg)
    except (OSError, ValueError):  # not there (the usual case), or not a directory this reads
        return None


def _listed_step(cfg) -> int | None:
    """`kept_step`, its listing's OSError raised."""
    from minilmd.untrusted import listed

    return max((s for s in map(step_or_none, listed(place(cfg))) if s is not None), default=None)


def bring_back(cfg, expected: Any) -> str:
    """At staging: the kept checkpoint fetched into scratch when it is newer than scratch's newest (a requeued job
    on another node, whose scratch is empty); what was done, in words ("" when nothing). A copy that does not verify
    is set aside by the fetch, and the start goes on as without it. CheckpointMismatch is raised as the fetch
    raises it."""
    with ONE_AT_A_TIME:
        return _bring_back(cfg, expected)


def _bring_back(cfg, expected: Any) -> str:
    kept = kept_step(cfg)
    newest = max(local_checkpoint_steps(cfg.checkpoint_dir), default=None)
    if kept is None or (newest is not None and newest >= kept):
        return ""
    from minilmd.checkpoint import CheckpointMismatch

    syncer = _syncer(cfg, expected)
    try:
        fetched = syncer.fetch_latest(cfg.checkpoint_dir)
    except CheckpointMismatch:
        raise
    except Exception as e:  # noqa: BLE001 - a run.dir that cannot be read now: the remote's is the start then
        return f"step {kept} kept in {place(cfg)} could not be fetched ({e}): not resumed from"
    aside = "".join(_set_aside_words(one) for one in _kept_remote(syncer).set_aside_here)
    if fetched is None:
        return f"step {kept} kept in {place(cfg)} did not verify: not resumed from{aside}"
    return (f"resuming from step {step_or_none(fetched.name)}, which an earlier job's last sync could not put on "
            f"run.remote, kept in {place(cfg)}: the sync pushes it{aside}")


def _set_aside_words(one) -> str:
    """One copy the fetch set aside (keptremote.SetAside), said where it is, why, and whether it is removed later."""
    later = f"left there for good: {one.left}" if one.left else \
        "removed once run.remote holds its step or a newer one, or when the run is done"
    return f"; set aside in {one.where} ({one.reason}): {later}"


def drop_if_synced(cfg, remote_step: int | None, done: bool = False) -> str:
    """The kept checkpoint removed once run.remote holds its step or a newer one (only what this run's copy made:
    Syncer's rule), and a damaged copy set aside in its quarantine/ then too, or whatever its step when `done` (the
    run's end, the trainer ended done); what was done, in words ("" when nothing)."""
    with ONE_AT_A_TIME:
        return _drop_if_synced(cfg, remote_step, done)


def _drop_if_synced(cfg, remote_step: int | None, done: bool = False) -> str:
    from minilmd.untrusted import listed

    try:
        names = listed(place(cfg))
        kept = _listed_step(cfg)
    except (OSError, ValueError) as e:
        if getattr(e, "errno", None) in (errno.ENOENT, errno.ENOTDIR):  # none kept (the usual case)
            return ""
        return Left(f"the copy in {place(cfg)} is left there: it cannot be listed ({e})")
    said = []
    if kept is not None and remote_step is not None and remote_step >= kept:
        if why := _drop_kept(cfg, kept):
            words = f"step {kept} kept in {place(cfg)} is on run.remote now, but was left there: {why}"
            return Left(words) if isinstance(why, Left) else words
        said.append(f"removed step {kept} kept in {place(cfg)}")
        kept = None
    if QUARANTINE in names:
        said += _drop_set_aside(cfg, remote_step, done, kept)
    if not said:
        return ""
    emptied = f" ({place(cfg)}, empty then, with it)" if _remove_if_empty(cfg) else ""
    because = [f"run.remote has step {remote_step}"] if remote_step is not None else []
    return "; ".join(said) + f"{emptied}: " + "; ".join(because + (["the run is done"] if done else []))


def _drop_kept(cfg, kept: int) -> str | None:
    """The kept step and the LATEST naming it removed: why not (None when removed; a Left when run.dir failed it)."""
    remote = _syncer(cfg, None).remote
    try:
        why = remote.rm(step_name(kept))
        if why is None:
            remote.rm(LATEST, file=True)  # the pointer to it, when it is ours; left otherwise (a few bytes)
    except OSError as e:
        return Left(str(e))
    return why


def _drop_set_aside(cfg, remote_step: int | None, done: bool, kept: int | None) -> list[str]:
    """The damaged copies set aside in quarantine/ that the record proves this run's, removed when due (the run
    done, or run.remote holding their step or a newer one); unsynced/'s LATEST with them when no step is kept."""
    def due(step: int | None) -> bool:
        return done or (step is not None and remote_step is not None and remote_step >= step)

    remote = _kept_remote(_syncer(cfg, None))
    try:
        removed, left = remote.drop_set_aside(due)
        if removed and kept is None:
            remote.rm(LATEST, file=True)  # it named the copy set aside: nothing now
    except (OSError, ValueError) as e:  # run.dir failing, or refused by the place rule (PlaceRefused) now
        return [f"the damaged copy set aside in {place(cfg) / QUARANTINE} was not removed ({e})"]
    said = [f"removed the damaged copy set aside in {', '.join(removed)}"] if removed else []
    return (said + [", ".join(left)]) if left else said


def _kept_remote(syncer):
    """The KeptSyncer's remote, as the KeptRemote it is (its set-aside record and removal)."""
    from minilmd.daemon.jobs.keptremote import KeptRemote  # numpy: loaded with the Syncer already

    remote = syncer.remote
    assert isinstance(remote, KeptRemote)
    return remote


def _remove_if_empty(cfg) -> bool:
    """`<run.dir>/unsynced` removed when it is an empty directory of this user's (rmdir(2) at run.dir's checked
    descriptor: one that holds anything, a link or another's entry stays); whether it was."""
    from minilmd.dirfd import Dir
    from minilmd.perms import owned_by_me

    try:
        with Dir.open(cfg.run_dir, "run.dir") as run_dir:
            found = run_dir.lstat(KEPT_DIR)
            if found is None or not stat.S_ISDIR(found.st_mode) or not owned_by_me(found):
                return False
            run_dir.remove_dir(KEPT_DIR)  # ENOTEMPTY when anything is left in it: then it stays
    except (OSError, ValueError):  # not empty, gone, or run.dir refused by the place rule (PlaceRefused) now
        return False
    return True
