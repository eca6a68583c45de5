"""The fetch half of the sync: the newest valid remote checkpoint brought back into scratch (remote -> local).

`Syncer.fetch_latest()` (daemon/jobs/sync.py) does the way back for a resume when the local scratch has nothing:
each remote step, newest first, is downloaded into a temporary directory, hashed while it comes, validated strictly
there (`minilmd.checkpoint.validate`) and published under its name; one that does not validate is quarantined
(local remotes) or skipped, and LATEST repointed so that it names only a verified checkpoint. The checkpoint the
remote BEST names comes along. These are the `Syncer`'s own methods, kept here as a mixin so that each half of the
sync reads on its own. Torch-free.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from minilmd import checkpoint as ck
from minilmd.checkpoint_dirs import read_latest
from minilmd.daemon.jobs.remote import ListedManifest, Remote
from minilmd.dirfd import PlaceRefused
from minilmd.fsio import atomic_write_text, publish_dir, table_problems
from minilmd.names import BEST, LATEST, MANIFEST, fetch_tmp_name, is_step_name, step_of, step_or_none


class Fetcher:
    """Remote -> local: the `Syncer`'s fetch methods (a mixin; `Syncer.fetch_latest` is their entry point)."""

    local_root: Path
    expected: ck.Expectation | None
    log: Callable[[str], None]

    if TYPE_CHECKING:  # the Syncer's, shared with the copy up (daemon/jobs/sync.py)
        @property
        def remote(self) -> Remote: ...

        def _steps(self) -> list[str]: ...

    def _fetch_latest(self, local_root: Path) -> Path | None:
        remote = self.remote
        local_root.mkdir(parents=True, exist_ok=True)
        skipped = []
        for name in reversed(self._steps()):
            final, set_aside = self._fetch_one(name, local_root)
            if final is None:
                skipped += [name] if set_aside else []
                continue
            if read_latest(local_root) is None or _newer(name, read_latest(local_root)):
                atomic_write_text(local_root / LATEST, name + "\n")
            if skipped:  # LATEST may name one that just failed: it must only name a verified checkpoint
                self._repoint_remote(name)
            self.log(f"sync: fetched {remote.show(name)} to {final}")
            self._fetch_best(name, local_root)
            return final
        return None

    def _fetch_one(self, name: str, local_root: Path) -> tuple[Path | None, bool]:
        """Download one remote checkpoint into local_root and validate it there: (its local path, False), or (None,
        whether it was set aside as invalid; not when it has no manifest yet)."""
        remote = self.remote
        listed = remote.read_manifest(name)
        if listed.manifest is None:
            if listed.problems:
                self._set_aside_remote(name, listed.problems)
            return None, bool(listed.problems)
        final = local_root / name
        tmp = local_root / fetch_tmp_name(name, os.getpid())
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            problems = self._download(name, listed, tmp)
            if problems:
                self._set_aside_remote(name, problems)
                shutil.rmtree(tmp, ignore_errors=True)
                return None, True
            publish_dir(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final, False

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
        if remote.local:
            try:
                dest = remote.quarantine(name, f"fetch: {reason}")
            except (OSError, PlaceRefused) as e:  # not this user's real directory (a link, another's), quarantine/
                # is not, or the root is one dirfd's rule refuses: the fetch goes on to the older checkpoints
                self.log(f"sync: remote {remote.show(name)} is invalid ({reason}); skipped, not set aside: {e}")
                return
            self.log(f"sync: remote {remote.show(name)} is invalid ({reason}); moved to {dest}")
        else:
            self.log(f"sync: remote {remote.show(name)} is invalid ({reason}); skipped")


def _newer(name: str, than: str | None) -> bool:
    than_step = step_or_none(than)
    return than_step is None or step_of(name) > than_step
