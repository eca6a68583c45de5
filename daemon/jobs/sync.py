"""Sync: copy the newest strictly validated local checkpoint to durable shared storage, atomically.

The user's procedure after the SIGBUS crash, automated: every 15 minutes, copy the newest checkpoint from the RAM
disk back to NFS, so that local copies may be deleted only after a verified sync. The remote is an NFS path or any
fsspec URL (tested with local paths and `memory://`). The protocol of `Syncer.sync_newest()`:

0. the remote is this run's: claimed by its first sync, another run's refused (daemon/jobs/remote_claim.py);
1. remove the `.tmp-*` an interrupted sync of this run left (its pid gone), proven by the run's record of what its
   syncs made (daemon/jobs/remote_made.py: a name proves nothing where others may rename); another's is left, said
   (daemon/jobs/sync_leftovers.py);
2. take the newest local checkpoint that validates (`minilmd.checkpoint.validate`, torch-free); a step the remote
   already holds intact is not copied again, nor is anything older than the remote's newest (but a step 0 of a
   stopped DPO reference pass is replaced by a further one: daemon/jobs/sync_pass.py);
3. copy its files to `<remote>/.tmp-step-XXXXXXXX-<host>-<pid>-<ticks>-boot<tag>/` (tmpnames.sync_tmp_name), manifest
   last, then read the remote copy back and check sizes and sha256 against the manifest;
4. rename it to `step-XXXXXXXX` (local/NFS paths); where the store has no rename (object stores, memory://) the
   files go straight to `step-XXXXXXXX/` and the manifest is written last: a directory without a manifest does
   not exist for any reader;
5. replace the remote `LATEST` (temp name + rename where possible), only ever with a verified checkpoint;
6. retention: keep the newest `keep` intact checkpoints (and whatever LATEST and BEST name), delete older ones;
   the checkpoint a local BEST names (early_stop) is copied too, and the remote BEST then names it.
On a local remote (others write it too) nothing is written through a link, and only this user's real directories
(a pointer's temp files) are deleted or quarantined, whatever their names say (daemon/jobs/remote_write.py); a
deletion also needs remote_made.why_kept's proof that the run made it (a step: its manifest naming it).
A LoRA run's staged base goes to `<remote>/init` once, before its first checkpoint (daemon/jobs/basecopy.py).

Steps 3 and 4 are daemon/jobs/sync_copy.py's; what a sync returns and raises is daemon/jobs/sync_errors.py's.
`fetch_latest()` does the way back for a resume when the local scratch has nothing (daemon/jobs/fetch.py).
Everything is blocking and raises SyncError with its cause; the supervisor runs it in a worker thread and retries
with backoff. Torch-free.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from minilmd import checkpoint as ck
from minilmd.checkpoint_dirs import list_checkpoints, read_best
from minilmd.daemon.base.runstate import is_disk_full
from minilmd.daemon.base.worker import ReadWatch, error_words
from minilmd.daemon.jobs import basecopy, remote_claim, remote_made, remote_root, sync_leftovers, sync_pass
from minilmd.daemon.jobs.fetch import Fetcher
from minilmd.daemon.jobs.remote_local import LocalRemote, open_remote
from minilmd.daemon.jobs.remote_store import RemoteStore, Scan
from minilmd.daemon.jobs.sync_copy import CopyUp
from minilmd.daemon.jobs.sync_errors import (
    RemoteFull,
    RemoteGone,
    RemoteNotOurs,
    RemoteOfAnotherRun,
    ShareDead,
    SyncAbandoned,
    SyncError,
    SyncResult,
)
from minilmd.daemon.jobs.sync_leftovers import STALE_TMP_SECONDS  # noqa: F401 - sync.STALE_TMP_SECONDS, as before
from minilmd.mounts import DEAD_MOUNT_ERRNOS
from minilmd.names import BEST, LATEST, REMOTE_OWNER, step_name, step_of, step_or_none
from minilmd.proc_info import this_maker
from minilmd.run_states import REMOTE_UNAVAILABLE
from minilmd.tmpnames import pointer_tmp_tag

PLACING_WAIT_S = 10.0
"""How long an abandon waits for a repoint of LATEST under way (Syncer.placing): a few operations on a slow remote,
well within the REQUEUE_MARGIN_S (20 s) a Slurm job's cut leaves before its end."""


class Syncer(CopyUp, Fetcher):
    """Copies checkpoints between a local root (scratch) and a remote (path or fsspec URL). Blocking; one at a
    time per run (the supervisor's sync worker)."""

    def __init__(self, local_root: str | os.PathLike, remote: str, expected: ck.Expectation | None = None,
                 keep: int = 3, log: Callable[[str], None] = lambda msg: None, base: Path | None = None,
                 claim: remote_claim.Claim | None = None, run_dir: Path | None = None):
        self.local_root = Path(local_root)
        self.run_dir = run_dir
        """The run's run.dir, where it keeps the record of what its syncs made on a local remote (remote_made.py: it
        outlives a reboot that empties scratch); None (a tool, a test): the record is kept in scratch."""
        self.claim = claim
        """The run the remote must belong to (daemon/jobs/remote_claim.py): claimed at the first sync, checked at
        each; None (a tool, a test) syncs without a claim."""
        self.base = base
        """A LoRA run's staged base (`<scratch>/init`): copied once to `<remote>/init` (daemon/jobs/basecopy.py)."""
        self.remote_url = remote
        self.expected = expected
        self.keep = max(1, keep)
        self.log = log
        self._remote: RemoteStore | None = None
        self._told: set[tuple[str, str]] = set()
        """(name, why) of what on the remote was left as not this run's, logged once."""
        self.base_problem: str | None = None
        """Why the remote holds no copy of a LoRA run's base after the last sync (None: it does, or no LoRA base):
        the run does not end `done` while it says something (SyncWorker.final_sync)."""
        self.base_full: RemoteFull | None = None
        """The base's push found the remote full (ENOSPC, EDQUOT: its free bytes, its inodes when none is left), at
        the latest sync; None otherwise: the last sync waits for room then, as for a checkpoint's copy."""
        self.copying: Path | None = None
        """The local checkpoint a running sync_newest() is validating or copying (read by the supervisor's pruning
        from another thread: it must not delete it)."""
        self.watch = ReadWatch()
        """What a running sync does on the remote and when it last answered (each chunk copied or read back, each
        step done): the supervisor tells a slow sync from a stalled one by it (daemon/jobs/syncworker.py)."""
        self.fetch_set_aside: list[str] = []
        """What the last fetch set aside as invalid, in words (daemon/jobs/fetch.py)."""
        self.abandoned = ""
        """Why the supervisor gave up on the running sync ("" while it has not): its next chunk raises SyncAbandoned,
        so that the copy ends before it is put in place and removes its half copy itself."""
        self.placing = threading.Lock()
        """Held while LATEST is repointed: an abandon (SyncWorker.abandon) waits for a repoint under way, so that the
        words of a Slurm job's cut name the step the remote's LATEST names (before: `keeps step 10` while a repoint
        already past its last check put step 40 in place)."""
        self.latest_placed = ""
        """The step this Syncer pointed the remote's LATEST at last ("" before one): read by an abandon."""

    def abandon(self, why: str, wait_s: float = PLACING_WAIT_S) -> str:
        """The supervisor gives up on this sync (`abandoned`), once a repoint of LATEST under way has ended (waited
        for `wait_s` at most): no repoint begins after it. The step LATEST was last pointed at ("" for none)."""
        waited = self.placing.acquire(timeout=wait_s)
        self.abandoned = why
        if waited:
            self.placing.release()
        return self.latest_placed

    @property
    def remote(self) -> RemoteStore:
        if self._remote is None:
            try:
                self._remote = open_remote(self.remote_url, pointer_tmp_tag(*this_maker()))
            except (ValueError, ImportError) as e:
                raise SyncError(f"cannot open remote {self.remote_url!r}: {e}") from e
            if isinstance(self._remote, LocalRemote):  # what this run's syncs made there: all they may remove
                self._remote.made = remote_made.record_of(self.local_root, self.run_dir)
                if self.claim is not None:  # a root gone is made again only where the run never synced
                    self._remote.synced_before = self.claim.synced_before
            self._remote.moved = self._moved
        return self._remote

    def _moved(self, nbytes: int) -> None:
        """A chunk copied or read back: progress for the ReadWatch, and the point where an abandoned sync stops."""
        self._go_on()
        self.watch.answer(nbytes)

    def _go_on(self) -> None:
        """SyncAbandoned once the supervisor gave up on this sync: checked at each chunk and again before anything
        is put in place (the rename, LATEST, retention), so that an abandon after the last chunk changes nothing."""
        if self.abandoned:
            raise SyncAbandoned(f"sync to {self.remote_url} abandoned: {self.abandoned}")

    # --- local -> remote ---------------------------------------------------------------------------------------
    def sync_newest(self) -> SyncResult:
        started = time.monotonic()
        self.watch.reading(f"looking at {self.remote_url}")
        try:
            return self._sync_newest(started)
        except (RemoteNotOurs, RemoteOfAnotherRun, SyncAbandoned):
            raise
        except remote_root.NotTheRoot as e:  # a share unmounted, the root replaced: waited for, nothing written
            raise RemoteGone(f"{REMOTE_UNAVAILABLE}: {e}") from e
        except Exception as e:  # an OSError from NFS, a backend error from fsspec: all mean "retry later"
            if dead := self._dead_mount(e):  # a share that answers nothing until mounted again: waited for
                raise ShareDead(f"{REMOTE_UNAVAILABLE}: {dead}") from e
            if isinstance(e, SyncError):
                raise
            message = f"sync to {self.remote_url} failed: {error_words(e)}"
            if is_disk_full(e):
                raise RemoteFull(message, self.remote.free(), self.remote.inodes_if_none_left()) from e
            raise SyncError(message) from e
        finally:
            self.copying = None
            self.watch.reading("")

    def _dead_mount(self, error: BaseException) -> str:
        """LocalRemote.dead_mount's words when `error`, or what it came from, is one of mounts.DEAD_MOUNT_ERRNOS
        and the root itself answers one now (a file's error alone proves nothing of the share); "" otherwise."""
        cause: BaseException | None = error
        for _ in range(8):  # a SyncError's cause, its cause's...: a chain of a few, bounded all the same
            if cause is None:
                break
            if isinstance(cause, OSError) and cause.errno in DEAD_MOUNT_ERRNOS:
                return self._remote.dead_mount() if isinstance(self._remote, LocalRemote) else ""
            cause = cause.__cause__ or cause.__context__
        return ""

    def _sync_newest(self, started: float) -> SyncResult:
        remote = self.remote
        self._make_root(remote)
        self._ensure_claim()
        if isinstance(remote, LocalRemote) and self.claim is not None:  # a run's (a tool's syncs: no claim, no record)
            remote.remember_root()  # what the root is, for every later sync to know it by (remote_root.py)
        claim = remote_claim.encoded(self.claim, self.remote) if self.claim is not None else None
        sync_leftovers.clean_remote_tmp(self.remote, self.base, self._leave, self._once, self.log, claim)
        self._sync_base()
        self.watch.reading(f"looking at {self.remote_url}")
        # Intact = manifest present and every size right (cheap); hashes were read back when each was copied.
        scan = self._scan()
        remote_steps = [n for n, (_, problems) in scan.items() if not problems]
        remote_newest = max((step_of(n) for n in remote_steps if self._made_here(n)), default=None)

        for local in reversed(list_checkpoints(self.local_root)):
            step = step_of(local)
            if remote_newest is not None and step < remote_newest:
                break  # the remote already holds something newer
            self.copying = local
            if local.name in remote_steps:
                self._point_latest(local.name, scan, verify=False)
                return self._finish(step, scan, verified=True, copied=False, nbytes=0, started=started)
            try:
                ck.validate(local, self.expected)
            except ck.CheckpointError as e:
                self.log(f"sync: skipping local {local}: {'; '.join(e.problems[:3])}")
                continue
            nbytes = self._copy_up(local, scan)
            self._point_latest(local.name, scan, verify=False)
            return self._finish(step, scan, verified=True, copied=True, nbytes=nbytes, started=started)

        if remote_newest is None:
            return SyncResult(None, None, False, seconds=time.monotonic() - started)
        name = step_name(remote_newest)
        self._point_latest(name, scan, verify=True)
        return self._finish(remote_newest, scan, verified=True, copied=False, nbytes=0, started=started)

    @staticmethod
    def _make_root(remote: RemoteStore) -> None:
        """remote.makedirs(); its refusal of the root (another user's directory at run.remote's path now) says first
        that the root was replaced since this run claimed it, when it was (remote_claim.replaced)."""
        try:
            remote.makedirs()
        except ValueError as e:  # PlaceRefused
            if isinstance(remote, LocalRemote) and (why := remote_claim.replaced(remote)):
                raise type(e)(f"{why}; and {e}") from None
            raise

    def _ensure_claim(self) -> None:
        """The remote is this run's before anything is copied there or removed: claimed now when it is nobody's
        (remote_claim.ensure); RemoteOfAnotherRun when it is another run's (final: the run stops), RemoteNotOurs
        for any other refusal (retried: nothing is written meanwhile)."""
        if self.claim is None:
            return
        try:
            if remote_claim.ensure(self.remote, self.claim):
                self.log(f"sync: claimed {self.remote_url} for this run ({self.remote.show(REMOTE_OWNER)})")
        except remote_claim.ClaimRefused as e:
            if e.another_run:
                raise RemoteOfAnotherRun(e.another_run, detail=str(e)) from None
            raise RemoteNotOurs(f"sync to {self.remote_url} refused: {e}") from None

    def _claim_refused(self) -> str | None:
        """Why the fetch may take nothing from the remote (another run's claim); None also when the claim cannot be
        looked at now (the remote not there, EIO): the fetch's own look decides then (wait, or start from step 0)."""
        try:
            return remote_claim.problem(self.remote, self.claim) if self.claim is not None else None
        except OSError:
            return None

    def _finish(self, step: int, scan: Scan, verified: bool, copied: bool, nbytes: int, started: float) -> SyncResult:
        self._sync_best(scan)
        self.watch.answer()
        self._go_on()  # no older step pruned by a sync given up on
        removed = self._retention(scan)
        try:
            sync_pass.sync_further_pass(self, scan)
        except Exception as e:  # noqa: BLE001 - the newest step is copied and LATEST names it: this sync did its work
            self.log(f"sync: the further DPO reference pass in {self.local_root / sync_pass.PASS_STEP} not copied "
                     f"over the remote's: {error_words(e)} (tried again at the next sync)")
        name = step_name(step)
        if copied:
            self.log(f"sync: {name} copied to {self.remote.show(name)} and verified "
                     f"({nbytes / 1e6:,.1f} MB in {time.monotonic() - started:.1f}s)")
        return SyncResult(step, self.remote.show(name), verified, copied, nbytes, time.monotonic() - started,
                          tuple(removed))

    def _scan(self) -> Scan:
        """The remote's steps of this run (`_steps`), each with Remote.intact's (manifest, problems): its manifest
        and sizes read once a sync."""
        scan: Scan = {}
        for name in self._steps():
            scan[name] = self.remote.intact(name)
            self.watch.answer()  # the remote answers: one step looked at
        return scan

    def _made_here(self, name: str) -> bool:
        """Whether the remote step `name` of this run was made by a sync of this user (Remote.made_here): another
        user's step on a share that gives every file one owner is neither what the sync defers to (a planted
        step-99999990 would stop every copy and take LATEST) nor one of the `keep` it keeps."""
        return self.remote.made_here(name)

    def _problems(self, name: str, scan: Scan) -> list[str]:
        """Remote.intact's problems of `name`: this sync's scan's when it holds it (a name that is no step of
        this run's, a pointer may still name: read)."""
        return scan[name][1] if name in scan else self.remote.intact(name)[1]

    def _once(self, key: tuple[str, str], msg: str) -> None:
        if key not in self._told:
            self._told.add(key)
            self.log(msg)

    def _leave(self, name: str, why: str) -> None:
        """Say once that an entry of the remote a sync would remove is not this run's and was left."""
        if (name, why) not in self._told:
            self._told.add((name, why))
            self.log(f"sync: remote {self.remote.show(name)} is {why}: not made by this run, left as it is")

    def _steps(self) -> list[str]:
        """The remote's steps of this run (Remote.steps); the entries by a step name passed by, said once each."""
        steps, passed_by = self.remote.steps()
        for name, why in passed_by.items():
            self._leave(name, why)
        return steps

    def _sync_base(self) -> None:
        """The LoRA base beside the checkpoints, before the first of them: they cannot resume without it. A copy
        that fails (a quota the base exceeds, a remote `init` that cannot be replaced) is logged and tried again at
        the next sync, never a failed sync: the checkpoints go on being synced as without it; `base_problem` says
        why there is none, and the run's end waits on it."""
        if self.base is None or not (self.base / basecopy.INIT_RECORD).is_file():
            return
        self.watch.reading(f"copying the LoRA base to {self.remote.show(basecopy.REMOTE_BASE)}")
        host, pid, ticks, boot = this_maker()
        nbytes, self.base_problem, error = basecopy.push_or_say(self.remote, self.base, host, pid,
                                                                taken=self._base_taken, passes=(SyncAbandoned,),
                                                                ticks=ticks, boot=boot)
        self.base_full = RemoteFull(self.base_problem or "", self.remote.free(), self.remote.inodes_if_none_left(),
                                    basecopy.staged_bytes(self.base)) if error is not None and is_disk_full(error) \
            else None
        if self.base_problem:  # the checkpoints are synced all the same
            self._once(("base", self.base_problem), f"sync: the LoRA base has no durable copy: {self.base_problem}; "
                                                    f"tried again at each sync: the run does not end done without it")
        elif nbytes:
            self.log(f"sync: the LoRA base copied to {self.remote.show(basecopy.REMOTE_BASE)} and verified "
                     f"({nbytes / 1e6:,.1f} MB)")

    def _base_taken(self, found: str, fresh: str) -> None:
        self._once(("taken", basecopy.REMOTE_BASE), f"sync: {found}; the LoRA base copied under "
                                                    f"{self.remote.show(fresh)} instead (a fresh name each time it is "
                                                    f"still there)")

    def _sync_best(self, scan: Scan) -> None:
        """The checkpoint the local BEST names (early_stop's lowest val loss) on the remote too, copied and verified
        like the newest, and the remote BEST naming it once it is there (this sync's scan says whether it is)."""
        remote, name = self.remote, read_best(self.local_root)
        if not name or (remote.read_text(BEST) or "").strip() == name:
            return
        if name not in scan or scan[name][1]:
            local = self.local_root / name
            if self._copy_valid(local, scan, f"sync: BEST {local} not copied") is None:
                return
            self.log(f"sync: BEST {name} copied to {remote.show(name)} and verified")
        remote.write_latest(name, BEST)

    def _point_latest(self, name: str, scan: Scan, verify: bool) -> None:
        """Point the remote LATEST at `name` unless it already names a newer intact checkpoint (by `scan`)."""
        self._go_on()
        remote = self.remote
        current = (remote.read_text(LATEST) or "").strip()
        if current == name:
            return
        newer = step_or_none(current)
        if newer is not None and newer > step_of(name) and not self._problems(current, scan):
            return
        if verify:
            _, problems = remote.intact(name, full_hash=True)
            if problems:
                raise SyncError(f"remote {remote.show(name)} does not validate: {'; '.join(problems[:3])}")
        with self.placing:  # an abandon now waits for it, then knows the step put in place
            self._go_on()
            remote.write_latest(name)
            self.latest_placed = name
        self.watch.answer()
        if (remote.read_text(LATEST) or "").strip() != name:
            raise SyncError(f"{remote.show(LATEST)} does not read back as {name} after replacing it")

    def _retention(self, scan: Scan) -> list[str]:
        """Delete remote checkpoints beyond the newest `keep` intact ones (by this sync's scan); never the one LATEST
        names. Step directories without a manifest are leftovers of an interrupted copy on a store without rename.
        On a local remote only this user's real directories are deleted: another's, or a link, is left and said
        once."""
        remote = self.remote
        if self.claim is not None and (why := remote_claim.still_ours(remote, self.claim)):
            self._once(("retention", why), f"sync: retention left {self.remote_url} as it is: {why}; a checkpoint "
                                           f"this run did not write is never pruned")
            return []
        latest = (remote.read_text(LATEST) or "").strip()
        best = (remote.read_text(BEST) or "").strip()
        kept, removed = 0, list[str]()
        for name in sorted(scan, key=step_of, reverse=True):
            manifest, problems = scan[name]
            if manifest is None:  # a link has none: its manifest is not read through it
                self._remove(name, removed)
                continue
            if problems:
                self.log(f"sync: remote {remote.show(name)} is damaged: {'; '.join(problems[:3])}")
                continue  # kept for inspection, not counted
            if name == best:
                continue  # the lowest val loss stays, not counted among the newest
            if kept < self.keep or name == latest:
                kept += self._made_here(name)  # another's, where only a mark tells (an older minilmd's too): kept
                continue
            self._remove(name, removed)
        return removed

    def _remove(self, name: str, removed: list[str]) -> None:
        if why := self.remote.rm(name):
            self._leave(name, why)
        else:
            removed.append(name)
        self.watch.answer()  # the remote answers: one removed, or left

    # --- remote -> local ---------------------------------------------------------------------------------------
    def fetch_latest(self, local_root: str | os.PathLike | None = None) -> Path | None:
        """Bring the newest remote checkpoint that validates into local_root (default: this syncer's) and return
        its local path; None when the remote holds none. A damaged remote checkpoint is quarantined (local paths)
        or skipped, and LATEST repointed. CheckpointMismatch (a checkpoint of another run) is raised as is."""
        return self._fetching(self._fetch_latest, Path(local_root) if local_root is not None else self.local_root)

    def fetch_step(self, name: str, local_root: Path, only_if: Callable[[dict], bool]) -> Path | None:
        """Bring remote checkpoint `name` into local_root, in place of one there by that name, as the fetch brings
        any (downloaded, hashed, validated; set aside when invalid), when its manifest passes `only_if`; its local
        path, or None (daemon/jobs/scratch_behind.py: a newer step than scratch's, or a further reference pass's
        step 0 in place of scratch's)."""
        def one(root: Path) -> Path | None:
            final = self._fetch_one(name, root, only_if)[0]
            if final is not None:
                self._fetched(name, final, root)
            return final
        return self._fetching(one, local_root)

    def _fetching(self, fetch: Callable[[Path], Path | None], local_root: Path) -> Path | None:
        try:
            if why := self._claim_refused():
                raise SyncError(f"fetch from {self.remote_url} refused: {why}")
            return fetch(local_root)
        except (SyncError, ck.CheckpointMismatch):
            raise
        except Exception as e:
            raise SyncError(f"fetch from {self.remote_url} failed: {error_words(e)}") from e
