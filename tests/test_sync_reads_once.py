"""A sync and a fetch read each thing of the remote once (daemon/jobs/sync.py, daemon/jobs/remote.py).

Before, a sync judged every remote step intact (its manifest read, every file's size asked) when it began and again
in retention, and looked for BEST's step in a fresh listing; a fetch read the manifest of the checkpoint it fetched
twice (once to validate it, once more to write it beside the files: another user could change it in between); the
step names Remote.steps passed by reached the sync through an attribute of the Remote (`passed_by`) left from
whatever call last filled it. The counting remote below is a real local remote that counts its reads.
"""
from __future__ import annotations

import os
from collections import Counter

from minilmd.daemon.jobs.remote import Steps
from minilmd.daemon.jobs.remote_local import LocalRemote, open_remote
from minilmd.daemon.jobs.sync import Syncer
from minilmd.names import MANIFEST
from sync_helpers import EXPECTED, dirs, save, weights  # noqa: F401 - dirs, weights: fixtures


class CountingRemote(LocalRemote):
    """A local remote that counts the manifest reads (cat, open) and the size asked of each file, by step."""

    def __init__(self, url: str):
        super().__init__(url)
        self.manifests: Counter[str] = Counter()
        self.sizes: Counter[str] = Counter()

    def cat(self, path: str, max_bytes: int) -> bytes:
        names = self._names_of(path)
        if names[-1:] == (MANIFEST,):
            self.manifests[names[0]] += 1
        return super().cat(path, max_bytes)

    def open(self, *names: str):
        if names[-1:] == (MANIFEST,):
            self.manifests[names[0]] += 1
        return super().open(*names)

    def size(self, *names: str) -> int | None:
        self.sizes[names[0]] += 1
        return super().size(*names)


def counted(syncer: Syncer) -> CountingRemote:
    syncer._remote = CountingRemote(syncer.remote_url)
    return syncer._remote


def test_a_sync_reads_each_remote_checkpoint_once(dirs, weights, tmp_path):
    local, remote = dirs
    for step in (10, 20, 30):
        save(local, step, weights)
        Syncer(local, str(remote), EXPECTED, keep=5).sync_newest()
    files = len(os.listdir(remote / "step-00000010")) - 1  # the files its manifest lists
    save(local, 40, weights)
    syncer = Syncer(local, str(remote), EXPECTED, keep=5)
    reads = counted(syncer)
    assert syncer.sync_newest().step == 40
    held = ["step-00000010", "step-00000020", "step-00000030"]
    assert {s: reads.manifests[s] for s in held} == {s: 1 for s in held}
    assert {s: reads.sizes[s] for s in held} == {s: files for s in held}

    again = Syncer(local, str(remote), EXPECTED, keep=5)  # nothing to copy: the same, step 40 included
    reads = counted(again)
    assert (again.sync_newest().step, sorted(reads.manifests.values())) == (40, [1, 1, 1, 1])


def test_a_fetch_reads_the_manifest_of_what_it_fetches_once_and_writes_those_bytes(dirs, weights, tmp_path):
    local, remote = dirs
    save(tmp_path / "old-scratch", 10, weights)
    Syncer(tmp_path / "old-scratch", str(remote), EXPECTED).sync_newest()
    syncer = Syncer(local, str(remote), EXPECTED)
    reads = counted(syncer)
    assert syncer.fetch_latest() == local / "step-00000010"
    assert reads.manifests == Counter({"step-00000010": 1})
    assert (local / "step-00000010" / MANIFEST).read_bytes() == (remote / "step-00000010" / MANIFEST).read_bytes()


def test_the_steps_passed_by_are_returned_not_kept_on_the_remote(dirs, weights, tmp_path):
    local, remote = dirs
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED).sync_newest()
    (remote / "step-00000020").symlink_to(tmp_path)
    r = open_remote(str(remote))
    assert r.steps() == Steps(["step-00000010"], {"step-00000020": f"a symbolic link to {tmp_path}"})
    (remote / "step-00000020").unlink()
    assert r.steps() == Steps(["step-00000010"], {})  # nothing of the call before carried over
    logs: list[str] = []
    (remote / "step-00000030").symlink_to(tmp_path)
    Syncer(local, str(remote), EXPECTED, log=logs.append).sync_newest()
    said = f"sync: remote {remote}/step-00000030 is a symbolic link to {tmp_path}: not made by this run, left as it is"
    assert logs.count(said) == 1, logs
