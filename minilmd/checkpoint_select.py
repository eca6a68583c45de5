"""Which checkpoints a run resumes from and which it keeps: the newest one that validates (a damaged one is
quarantined and the next older tried, one of another run refused), and pruning down to the newest valid ones.
Both walk a root newest first and validate (minilmd/checkpoint.py). Also what a run directory given to a command
stands for (`run_roots`: where its checkpoints are, read from its run.toml), for `sample/chat/export RUN_DIR`
(the checkpoint a resume would take) and `verify RUN_DIR` (every checkpoint of those roots). Torch-free.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from minilmd.checkpoint import CheckpointError, CheckpointInvalid, Expectation, read_manifest, validate
from minilmd.checkpoint_contents import reference_pass
from minilmd.checkpoint_dirs import list_checkpoints, quarantine, read_best
from minilmd.names import MANIFEST, MODEL_FILE, RUN_CONFIG_COPY, step_of
from minilmd.proc_info import this_process
from minilmd.scratch_end import SCRATCH_GONE_WHY
from minilmd.supervision import supervision
from minilmd.tmpnames import deleting_name
from minilmd.urls import local_remote_root

if TYPE_CHECKING:
    from minilmd.config import RunConfig

T = TypeVar("T")


def checkpoint_roots(cfg: RunConfig) -> list[Path]:
    """Where a run's checkpoints are, for find_latest: its scratch's, then its run.remote when that is a local path
    (a resume's roots, trainer/loop/resume.py; `minilmd sample/export RUN_DIR`'s, trainer/model/export_paths.py)."""
    roots = [cfg.checkpoint_dir]
    remote = local_remote_root(cfg.run.remote)  # a path, file://, local:// (the one answer)
    # A supervisor has already fetched from the remote (in a thread): a stalled NFS must not hang the trainer.
    if remote and supervision() is None:
        roots.append(Path(remote))
    return roots


ROOT_KINDS = ("scratch", "run.remote")
"""What checkpoint_roots' roots are, in its order: a run's scratch, its run.remote."""


class RunDirUnusable(ValueError):
    """A run directory whose run.toml, which says where its checkpoints are, cannot be read."""


@dataclass(frozen=True)
class RunRoots:
    """A run directory given to a command (`run_roots`): its config (its run.toml) and where its checkpoints are."""

    run_dir: Path
    cfg: RunConfig
    roots: list[Path]
    """checkpoint_roots(cfg): its scratch's, then its run.remote's when that is a local path; without the scratch's
    when it is not looked in (`skipped`)."""
    skipped: str = ""
    """Why its scratch is not looked in (scratch_root.not_looked_in: another user's stands there), "" when it is."""

    @property
    def kinds(self) -> tuple[str, ...]:
        """ROOT_KINDS of `roots`, in their order."""
        return ROOT_KINDS[1:] if self.skipped else ROOT_KINDS

    def found(self) -> list[tuple[str, Path]]:
        """(kind, root) of the roots that are there, in order (ROOT_KINDS); all of them when none is."""
        there = [(kind, root) for kind, root in zip(self.kinds, self.roots, strict=False) if os.path.lexists(root)]
        return there or list(zip(self.kinds, self.roots, strict=False))

    @property
    def where(self) -> str:
        """The roots that are there, for a message: `A and B` (a scratch gone is said by `gone`)."""
        return " and ".join(str(root) for _, root in self.found())

    @property
    def gone(self) -> str:
        """`; its scratch S is gone (...)` when the scratch's checkpoint root is not there (a finished run removes
        its scratch once its last checkpoint is on run.remote; a reboot empties /dev/shm) and another root is, else
        "": the one home of these words, for `verify/sample/chat/export RUN_DIR`; its scratch not looked in, why."""
        if self.skipped:
            return f"; its scratch {self.cfg.scratch_dir} is not looked in: {self.skipped}"
        if os.path.lexists(self.roots[0]) or not any(os.path.lexists(root) for root in self.roots[1:]):
            return ""
        return f"; its scratch {self.roots[0]} is gone ({SCRATCH_GONE_WHY})"

    @property
    def unread(self) -> str:
        """` (its run.remote R is not read here)` when it has one that is not among the roots (s3://...), else ""."""
        remote = self.cfg.run.remote
        return f" (its run.remote {remote} is not read here)" if "run.remote" not in self.kinds[:len(self.roots)] \
            and remote else ""


def is_run_dir(path: Path) -> bool:
    """Whether a directory a command was given is a run directory (its run.toml, no model.safetensors of a
    checkpoint): `minilmd sample/chat/export/verify RUN_DIR`."""
    return not (path / MODEL_FILE).is_file() and (path / RUN_CONFIG_COPY).is_file()


def run_roots(run_dir: Path) -> RunRoots:
    """Where the checkpoints of a run directory are: its run.toml (run_config_copy.run_config_of: the run's user's
    or ours, no link followed), and the roots a resume of the run takes (checkpoint_roots).
    A scratch that is not the run's (scratch_root.not_looked_in, judged for the run directory's owner, as `status`
    and `stop` judge it) is left out, said (`skipped`), and its run.remote used; RunDirUnusable when it has no local
    run.remote then, when that run.toml cannot be used, or when another user's run names a remote that is not that
    run's (run_owner.remote_not_the_runs: the reader's own private one, say)."""
    from minilmd.config import ConfigError
    from minilmd.corpus_meta import corpus_train_tokens
    from minilmd.init_place import open_named
    from minilmd.perms import run_dir_owner, user_words
    from minilmd.run_config_copy import run_config_of
    from minilmd.run_owner import remote_not_the_runs
    from minilmd.scratch_root import RecordUnreadable, not_looked_in

    try:
        with open_named(run_dir) as opened:  # once: run.toml and the owner its scratch is judged for, of one directory
            cfg = run_config_of(run_dir, opened.fd, train_tokens_of=corpus_train_tokens)
            if (owner := run_dir_owner(run_dir, opened.fd)) is None:
                raise OSError("the run directory cannot be looked at now")
        roots = checkpoint_roots(cfg)  # a default scratch in a private root: run.dir's record names it
        squatted = not_looked_in(cfg.scratch_dir, owner)  # another user's: no run of ours went there
        if squatted and len(roots) == 1:
            raise RunDirUnusable(f"{run_dir}: its scratch is not looked in: {squatted}")
    except (ConfigError, OSError, ValueError, RecordUnreadable) as e:  # ValueError: init_place.Refused
        why = "; ".join(e.problems[:3]) if isinstance(e, ConfigError) else str(e)
        raise RunDirUnusable(f"{run_dir}: a run directory whose {RUN_CONFIG_COPY}, which says where its "
                             f"checkpoints are, cannot be used ({why})") from None
    if len(roots) > 1 and (foreign := remote_not_the_runs(roots[-1], run_dir, owner)):
        raise RunDirUnusable(f"{run_dir}: a run directory of {user_words(owner)}: {foreign}")
    return RunRoots(run_dir, cfg, roots[1:], squatted) if squatted else RunRoots(run_dir, cfg, roots)


def resume_order(roots: Iterable[str | os.PathLike]) -> list[tuple[int, Path]]:
    """(root index, checkpoint) of every checkpoint of the roots (list_checkpoints: a root's own, with a
    manifest), in the order a resume tries them: the newest step first, on equal steps the earlier root (local);
    but of two step 0s of a stopped DPO reference pass, the further on first (a run.remote's, synced from another
    machine's later stop, over a scratch left behind: _pass_behind)."""
    candidates = [(step_of(p), i, p) for i, root in enumerate(roots) for p in list_checkpoints(root)]
    return [(i, p) for _, i, p in sorted(candidates, key=lambda c: (-c[0], _pass_behind(c[2]), c[1]))]


def _pass_behind(path: Path) -> float:
    """Pairs a step 0's stopped DPO reference pass has still to do (0: its sums complete, or no pass; the
    manifest's REFERENCE_PASS, read as untrusted: one that cannot be read sorts last, and validation says why)."""
    if step_of(path) != 0:
        return 0
    try:
        manifest = read_manifest(path)
    except CheckpointError:
        return float("inf")
    done = reference_pass(manifest) if isinstance(manifest, dict) else None
    return 0 if done is None else done[1] - done[0]


def find_latest(roots: Iterable[str | os.PathLike], expected: Expectation | None = None,
                log: Callable[[str], None] = print, set_aside: bool = True,
                reuse: bool = False) -> Path | None:
    """The newest checkpoint that validates, across roots (on equal steps the earlier root, local, wins).

    One that is damaged is logged with its reason, quarantined when it is in the first root (the local one, the
    run's scratch), and the next older is tried. A damaged one in another root (a local run.remote, which other
    users may write: a `quarantine` link planted there would be followed) is only logged and passed by: setting a
    remote's checkpoint aside is the supervisor's (daemon/jobs/remote_write.py set_aside, with its checks). One
    that belongs to a different model config, tokenizer or corpus raises CheckpointMismatch: resuming is refused,
    not replaced by an older checkpoint or a fresh start. None when no root holds a valid checkpoint. `set_aside`
    False (a reader such as `minilmd sample RUN_DIR`): nothing is moved, a damaged one of the first root too.
    `reuse`: a validation this process made a moment ago of the same unchanged checkpoint stands (validate_once:
    the supervisor's start looks at scratch's newest twice, at launch and in staging)."""
    found = first_valid(roots, lambda path: (validate_once if reuse else validate)(path, expected), log, set_aside)
    return found[0] if found else None


def first_valid(roots: Iterable[str | os.PathLike], check: Callable[[Path], T], log: Callable[[str], None] = print,
                set_aside: bool = True) -> tuple[Path, T] | None:
    """find_latest's walk, each checkpoint tried by check(path) (which raises as validate does), with what check
    gave of the one taken: a resume validates and keeps what it loads in one read
    (checkpoint_load.validated_for_loading)."""
    for root_index, path in resume_order(roots):
        try:
            return path, check(path)
        except CheckpointInvalid as e:
            if not path.exists():  # pruned by another process meanwhile: not a damaged checkpoint
                continue
            why = "; ".join(e.problems)
            if root_index == 0 and set_aside:
                log(f"checkpoint {path} is invalid: {why} -- moved to {quarantine(path, why)}, trying an older one")
            else:
                kept = "not the local root's" if root_index else "only read here"
                log(f"checkpoint {path} is invalid: {why} -- not moved ({kept}), trying an older one")
    return None


REUSE_FOR_S = 300.0
"""How long validate_once lets a validation stand: a start's two looks are seconds apart (longer only while the
launch waits for a GPU); a later look hashes again."""
REUSE_MAX_ENTRIES = 64
_validated: dict[tuple[str, str], tuple[tuple, float]] = {}


def validate_once(path: Path, expected: Expectation | None) -> None:
    """validate(path, expected), unless this process validated `path` against the same expectation less than
    REUSE_FOR_S ago and nothing in it has changed since (`_identity`). Raises as validate does; a failure is never
    remembered.

    Why it is safe, against a damaged or a hostile scratch too: every byte validate hashed is in a file whose lstat
    (inode, size, mode, mtime and ctime in ns) `_identity` records before the hash and again after it (a change
    while hashing: nothing remembered). A write, a truncation, a chmod, a rename over it or a link put in its place
    changes them, and ctime cannot be set back by anyone but root (utime sets it to now). Scratch is this run's
    (0700, claimed: minilmd/scratch.py), so no other user can write there at all. What no stat shows (memory
    going bad under tmpfs) is no worse than before: the old code's staging validated seconds before the trainer,
    which validates again whatever it resumes (this is not used there), and quarantines a damaged one."""
    import time

    key, before = (str(path), repr(expected)), _identity(path)
    if before is not None and (seen := _validated.get(key)) and seen[0] == before and \
            time.monotonic() - seen[1] < REUSE_FOR_S:
        return
    validate(path, expected)
    if before is not None and _identity(path) == before:
        while len(_validated) >= REUSE_MAX_ENTRIES:
            _validated.pop(next(iter(_validated)))
        _validated[key] = (before, time.monotonic())


def _identity(path: Path) -> tuple | None:
    """The lstat of a checkpoint directory and of each of its entries (no link followed), or None when it cannot
    be taken or it holds more entries than any checkpoint does (then nothing is remembered)."""
    from minilmd.untrusted import listed

    try:
        stats = [(name, os.lstat(path / name)) for name in [".", *sorted(listed(path, max_entries=REUSE_MAX_ENTRIES))]]
    except OSError:  # TooManyEntries too
        return None
    return tuple((name, st.st_dev, st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
                 for name, st in stats)


_valid_cache: dict[tuple, bool] = {}


def _is_valid_cached(path: Path) -> tuple[bool, str]:
    """Validation for pruning, remembered per manifest identity so that each checkpoint is read once."""
    try:
        st = (path / MANIFEST).stat()
    except FileNotFoundError:
        return False, f"no {MANIFEST}"
    key = (str(path.resolve()), st.st_ino, st.st_mtime_ns, st.st_size)
    if key in _valid_cache:
        return True, ""
    try:
        validate(path)
    except CheckpointError as e:
        return False, "; ".join(e.problems)
    _valid_cache[key] = True
    return True, ""


def prune(root: str | os.PathLike, keep: int, protect: Iterable[str | os.PathLike] = (),
          log: Callable[[str], None] = print) -> list[Path]:
    """Keep the newest `keep` (at least 1) valid checkpoints; delete the older ones, except `protect`ed ones and
    the one BEST names.

    Walks newest first; a damaged checkpoint met before `keep` valid ones were found is quarantined and does not
    count. So the newest valid checkpoint is never deleted. Returns the deleted directories."""
    root = Path(root)
    protected = {Path(p).resolve() for p in protect}
    best = read_best(root)
    if best:  # the best checkpoint by val loss stays as long as BEST names it
        protected.add((root / best).resolve())
    keep = max(1, keep)
    kept, deleted = 0, []
    for path in reversed(list_checkpoints(root)):
        # The trainer and the supervisor may both prune this root: whatever vanished meanwhile is skipped.
        if kept < keep:
            ok, reason = _is_valid_cached(path)
            if ok:
                kept += 1
            elif path.exists():
                try:
                    dest = quarantine(path, reason)
                    log(f"checkpoint {path} is invalid: {reason} -- moved to {dest}")
                except FileNotFoundError:
                    pass
            continue
        if path.resolve() in protected:
            continue
        # Rename first: readers never see a half-deleted directory with its manifest still in place.
        doomed = root / deleting_name(path.name, *this_process())
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        deleted.append(path)
    return deleted
