"""The fetch half of the sync: the newest valid remote checkpoint brought back into scratch (remote -> local).

`Syncer.fetch_latest()` (daemon/jobs/sync.py) does the way back for a resume when the local scratch has nothing:
each remote step, newest first, is downloaded into a temporary directory, hashed while it comes, validated strictly
there (`minilmd.checkpoint.validate`) and published under its name; one that does not validate is quarantined
(local remotes) or skipped, and LATEST repointed so that it names only a verified checkpoint. The checkpoint the
remote BEST names comes along. These are the `Syncer`'s own methods, kept here as a mixin so that each half of the
sync reads on its own. Torch-free.
"""
from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd import checkpoint as ck
from minilmd.batch_stream import stream_record
from minilmd.checkpoint_dirs import read_latest
from minilmd.daemon.jobs.remote_store import ListedManifest, RemoteStore
from minilmd.daemon.jobs.sync_errors import FetchStopped
from minilmd.dirfd import PlaceRefused
from minilmd.fsio import atomic_write_text, publish_dir, table_problems
from minilmd.names import BEST, LATEST, MANIFEST, TRAINER_STATE, is_step_name, step_of, step_or_none
from minilmd.proc_info import this_process
from minilmd.tmpnames import fetch_tmp_name
from minilmd.untrusted import Unreadable, loads

READ_AGAIN_AFTER_S = (2.0, 5.0)
"""A remote checkpoint that does not verify is read again, afresh (a new open of each file: an NFS client
revalidates its cached size and pages at open), after each of these pauses, before it is set aside: a stale
attribute cache or a short read of a moment passes; a damaged checkpoint reads the same each time. A stop ends the
pause at once (Fetcher.fetch_stop)."""


class Fetcher:
    """Remote -> local: the `Syncer`'s fetch methods (a mixin; `Syncer.fetch_latest` is their entry point)."""

    local_root: Path
    expected: ck.Expectation | None
    log: Callable[[str], None]
    abandoned: str  # the Syncer's: why the supervisor gave up on it ("" while it has not)
    remote_url: str
    fetch_stop: threading.Event | None = None
    """Set when the supervisor stops (staging's: StagingWorker.stop): the fetch ends before its next read of a
    remote checkpoint, and its pause before a read again wakes at once (FetchStopped). None: no stop ends it."""

    if TYPE_CHECKING:  # the Syncer's, shared with the copy up (daemon/jobs/sync.py)
        @property
        def remote(self) -> RemoteStore: ...

        def _steps(self) -> list[str]: ...

    fetch_set_aside: list[str]
    """What the fetches of this Syncer set aside as invalid (reset by each `fetch_latest`), in words
    ("URL/step-00000200 (moved to DEST)"), for staging to say and to judge its start by (stagingfetch.py)."""

    def _fetch_latest(self, local_root: Path) -> Path | None:
        local_root.mkdir(parents=True, exist_ok=True)
        self.fetch_set_aside = []
        skipped = []
        for name in reversed(self._steps()):
            final, set_aside = self._fetch_one(name, local_root)
            if final is None:
                skipped += [name] if set_aside else []
                continue
            if skipped:  # LATEST may name one that just failed: it must only name a verified checkpoint
                self._repoint_remote(name)
            self._fetched(name, final, local_root)
            return final
        return None

    def _fetched(self, name: str, final: Path, local_root: Path) -> None:
        """Remote checkpoint `name`, fetched to `final`: the local LATEST names it when it is the newest there (a
        scratch that holds older ones too: daemon/jobs/scratch_behind.py), said, and the remote's BEST comes along
        (the next sync would otherwise point the remote BEST back at scratch's older one)."""
        if read_latest(local_root) is None or _newer(name, read_latest(local_root)):
            atomic_write_text(local_root / LATEST, name + "\n")
        self.log(f"sync: fetched {self.remote.show(name)} to {final}")
        self._fetch_best(name, local_root)

    def listed(self) -> list[str]:
        """The remote's steps of this run, oldest first, listed afresh (staging's second look at a listing older than
        the run's records: daemon/jobs/stagingfetch.py)."""
        return self._steps()

    def peek_latest(self, skip: frozenset[str] = frozenset()) -> tuple[str | None, list[str]]:
        """The checkpoint the fetch would bring back, told without fetching it (`run --check` and the launch,
        daemon/jobs/resumefrom.py): the newest of this run's remote steps, walked as the fetch walks them, whose
        manifest is valid and whose trainer_state.json, read as the fetch reads a remote file (from the root's
        descriptor, no link followed, a regular file only, no more than its listed size), has the size and sha256
        the manifest lists and fits `expected` (ck.check_recorded, validation's own rule). Returns (its name or None,
        why each newer one was passed by). Nothing is written, set aside or downloaded: the tensors are checked by the
        fetch itself. CheckpointMismatch, naming the remote checkpoint, when that newest one was trained with
        another model, corpus or tokenizer (the fetch would refuse it the same way). `skip`: steps a fetch just
        failed to validate (daemon/jobs/scratch_behind.py), passed by as the fetch passes them."""
        passed = []
        for name in reversed(self._steps()):
            if name in skip:
                continue
            listed = self.remote.read_manifest(name)
            if listed.manifest is None:
                passed += [f"checkpoint {self.remote.show(name)} is invalid: {'; '.join(listed.problems)} -- the "
                           f"fetch passes it by for an older one"] if listed.problems else []
                continue
            where = Path(self.remote.show(name))
            try:
                ck.check_recorded(where, self._recorded_state(name, listed.manifest), listed.manifest["step"],
                                  self.expected)
            except ck.CheckpointInvalid as e:
                passed.append(f"checkpoint {self.remote.show(name)} is invalid: {'; '.join(e.problems)} -- the "
                              f"fetch passes it by for an older one")
                continue
            return name, passed
        return None, passed

    def recorded_config(self, name: str):
        """The config remote checkpoint `name` records (batch_stream.stream_record of its trainer_state.json, read as
        peek_latest reads it), for `run --check` to compare its batch stream with the run's
        (daemon/jobs/resumefrom.py); None when it cannot be read (the fetch says why)."""
        listed = self.remote.read_manifest(name)
        try:
            return stream_record(self._recorded_state(name, listed.manifest)) if listed.manifest else None
        except ck.CheckpointInvalid:
            return None

    def recorded_base(self, name: str) -> dict | None:
        """The base remote checkpoint `name` records it was trained from (its trainer_state.json's "init", read as
        peek_latest reads it; None: it records none), for a LoRA run's done check with scratch wiped
        (daemon/jobs/rundone.py: the remote's base copy must be that base's). CheckpointInvalid when it cannot be
        read or does not match its manifest."""
        listed = self.remote.read_manifest(name)
        if listed.manifest is None:
            raise ck.CheckpointInvalid(Path(self.remote.show(name)), "; ".join(listed.problems) or "no manifest")
        init = self._recorded_state(name, listed.manifest).get("init")
        return init if isinstance(init, dict) else None

    def _recorded_state(self, name: str, manifest: dict) -> dict:
        """trainer_state.json of remote checkpoint `name`, read once and bounded, parsed from the bytes hashed
        against its manifest (ck.MAX_JSON_PART at most, as validation keeps it). Raises CheckpointInvalid."""
        entry, where = manifest["files"][TRAINER_STATE], Path(self.remote.show(name))
        if entry["size"] > ck.MAX_JSON_PART:
            raise ck.CheckpointInvalid(where, f"{TRAINER_STATE} is listed at {entry['size']} bytes, over "
                                              f"{ck.MAX_JSON_PART}")
        try:
            with self.remote.open(name, TRAINER_STATE) as f:
                raw = f.read(entry["size"] + 1)  # one byte more: a longer file shows as one
        except (FileNotFoundError, Unreadable) as e:
            raise ck.CheckpointInvalid(where, f"cannot read {TRAINER_STATE}: {getattr(e, 'why', e)}") from None
        if len(raw) != entry["size"] or hashlib.sha256(raw).hexdigest() != entry["sha256"]:
            raise ck.CheckpointInvalid(where, f"{TRAINER_STATE} does not match its {MANIFEST} (size or sha256)")
        try:
            return loads(raw, expect=dict)
        except Unreadable as e:
            raise ck.CheckpointInvalid(where, f"{TRAINER_STATE}: {e.why}") from None

    def _fetch_one(self, name: str, local_root: Path,
                   only_if: Callable[[dict], bool] | None = None) -> tuple[Path | None, bool]:
        """Download one remote checkpoint into local_root and validate it there: (its local path, False), or (None,
        whether it was set aside as invalid; not when it has no manifest yet). One that does not verify is read
        again, afresh, after each of READ_AGAIN_AFTER_S, and set aside only when every read fails. `only_if`: the
        manifest (the one whose bytes the download is checked against and writes) must pass it, else nothing is
        fetched. A checkpoint of that name in local_root is replaced whole (publish_dir)."""
        reads = len(READ_AGAIN_AFTER_S) + 1
        for pause in READ_AGAIN_AFTER_S:
            final, problems = self._read_one(name, local_root, only_if)
            if not problems:
                return final, False
            self.log(f"sync: remote {self.remote.show(name)} does not verify ({'; '.join(problems[:3])}): read "
                     f"again in {pause:g}s, afresh, before it is set aside (a short read or a stale size passes)")
            (self.fetch_stop or threading.Event()).wait(pause)  # a stop wakes it: the next read raises FetchStopped
        final, problems = self._read_one(name, local_root, only_if)
        if not problems:
            return final, False
        self._set_aside_remote(name, [f"{'; '.join(problems[:5])} (at each of {reads} reads)"])
        return None, True

    def _fetch_go_on(self, name: str) -> None:
        """FetchStopped once the supervisor stops (`fetch_stop`) or gave up on this Syncer (`abandoned`): checked
        before each read of a remote checkpoint, so that a stop never waits for every damaged step's reads again."""
        stopped = "the supervisor stops" if self.fetch_stop is not None and self.fetch_stop.is_set() else \
            self.abandoned
        if stopped:
            raise FetchStopped(f"fetch of {self.remote.show(name)} from {self.remote_url} stopped: {stopped} "
                               f"(nothing set aside)")

    def _read_one(self, name: str, local_root: Path,
                  only_if: Callable[[dict], bool] | None) -> tuple[Path | None, list[str]]:
        """One read of remote checkpoint `name` (_fetch_one): (its local path, []), (None, []) when it has no
        manifest yet or `only_if` refuses it, or (None, why it is invalid). FetchStopped when a stop came first."""
        self._fetch_go_on(name)
        remote = self.remote
        listed = remote.read_manifest(name)
        if listed.manifest is None:
            return None, listed.problems
        if only_if is not None and not only_if(listed.manifest):
            return None, []
        final = local_root / name
        tmp = local_root / fetch_tmp_name(name, *this_process())
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            problems = self._download(name, listed, tmp)
            if problems:
                shutil.rmtree(tmp, ignore_errors=True)
                return None, problems
            publish_dir(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final, []

    def _fetch_best(self, latest: str, local_root: Path) -> None:
        """The checkpoint the remote BEST names (early_stop's lowest val loss), fetched beside the newest when it is
        another one, and the local BEST naming it: a run resumed on a new machine keeps its best, for init.from of
        the next stage, `sample` and `export`. A BEST that does not validate is logged and left out."""
        best = (self.remote.read_text(BEST) or "").strip()
        if not best or not is_step_name(best) or best not in self.remote.steps().ours:
            return
        if best != latest and not (local_root / best / MANIFEST).is_file():
            if self._fetch_one(best, local_root)[0] is None:
                self.log(f"sync: BEST {self.remote.show(best)} is not usable: not fetched")
                return
            self.log(f"sync: fetched BEST {self.remote.show(best)} to {local_root / best}")
        atomic_write_text(local_root / BEST, best + "\n")

    def _download(self, name: str, listed: ListedManifest, tmp: Path) -> list[str]:
        """Download a remote checkpoint into tmp, hashing while downloading, and validate it strictly there; its
        manifest is the one `listed` read (a valid one), written from those bytes, never read again. Returns its
        problems (empty: good)."""
        manifest, raw = listed.manifest, listed.raw
        assert manifest is not None and raw is not None  # _fetch_one downloads a checkpoint with a valid manifest
        odd = self.remote.not_regular(name, manifest["files"])
        if odd:
            return odd
        observed = {f: (self.remote.get((name, f), tmp / f, e["size"]), (tmp / f).stat().st_size)
                    for f, e in manifest["files"].items()}
        problems = table_problems(manifest["files"], lambda f: observed[f][1], lambda f: observed[f][0],
                                  listed_in=f"the remote {MANIFEST}", label=lambda f: f"{f} (downloaded)")
        if problems:
            return problems
        (tmp / MANIFEST).write_bytes(raw)  # the bytes the files were checked against, read once; publish_dir fsyncs
        try:
            ck.validate(tmp, self.expected)
        except ck.CheckpointInvalid as e:
            return e.problems
        except ck.CheckpointMismatch as e:  # named as the remote checkpoint it is, not its temporary copy
            raise ck.CheckpointMismatch(self.remote.show(name), e.problems, e.kind, e.differences) from None
        return []

    def _repoint_remote(self, name: str) -> None:
        """The remote LATEST pointed at the checkpoint just fetched; where it cannot be (a root dirfd's rule refuses,
        PlaceRefused; the share failing), said: the checkpoint is fetched and valid all the same, and the next fetch
        passes by the invalid ones again."""
        try:
            self.remote.write_latest(name)
        except (OSError, PlaceRefused) as e:
            self.log(f"sync: {self.remote.show(LATEST)} not pointed at {name}: {e}")

    def _set_aside_remote(self, name: str, problems: list[str]) -> None:
        remote = self.remote
        reason = "; ".join(problems[:5])
        try:
            dest = remote.set_aside(name, f"fetch: {reason}")
        except (OSError, PlaceRefused) as e:  # not this user's real directory (a link, another's), quarantine/ is
            # not, or the root is one dirfd's rule refuses: the fetch goes on to the older checkpoints
            self.log(f"sync: remote {remote.show(name)} is invalid ({reason}); skipped, not set aside: {e}")
            self._said_aside(f"{remote.show(name)} (skipped, left in place: {e})")
            return
        if dest is None:  # a store without rename: nowhere to set it aside
            self.log(f"sync: remote {remote.show(name)} is invalid ({reason}); skipped")
            self._said_aside(f"{remote.show(name)} (skipped)")
        else:
            self.log(f"sync: remote {remote.show(name)} is invalid ({reason}); moved to {dest}")
            self._said_aside(f"{remote.show(name)} (moved to {dest})")

    def _said_aside(self, words: str) -> None:
        self.fetch_set_aside.append(words)


def _newer(name: str, than: str | None) -> bool:
    than_step = step_or_none(than)
    return than_step is None or step_of(name) > than_step
