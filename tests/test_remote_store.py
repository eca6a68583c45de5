"""Storage behind one Protocol (daemon/jobs/remote_store.py's RemoteStore): the sync, its fetch and the LoRA base's
copy ask the remote what they mean (`renames_into_place`, `made_here`, `set_aside`, `not_ours`, `look`), never which
kind of store it is. A caller that branches on the remote's own `local` flag again couples itself to one
implementation, and a second store (or the local and fsspec halves split apart) breaks it unseen."""
from __future__ import annotations

import ast
import os

import fsspec

import source_tree
from minilmd import checkpoint as ck
from minilmd.daemon.jobs.remote import Remote
from minilmd.daemon.jobs.remote_local import LocalRemote, open_remote
from minilmd.daemon.jobs.sync import Syncer
from minilmd.names import QUARANTINE
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture

REMOTE_MODULES = ("remote.py", "remote_local.py", "remote_publish.py", "remote_write.py", "remote_store.py")
"""The remote's own modules, daemon/jobs/remote*.py: the implementation may know which kind it is."""


def _reads_of_local() -> list[str]:
    found = []
    for path in source_tree.code_files():
        rel = path.relative_to(source_tree.REPO)
        if rel.parent.as_posix() == "daemon/jobs" and rel.name in REMOTE_MODULES:
            continue
        if "local" not in source_tree.source(path):  # parsed only where the name occurs at all
            continue
        found += [f"{rel}:{node.lineno}" for node in ast.walk(source_tree.tree(path))
                  if isinstance(node, ast.Attribute) and node.attr == "local"]
    return found


def test_no_caller_outside_the_remote_asks_which_kind_of_store_it_is():
    assert _reads_of_local() == [], "read the remote's `local` flag outside daemon/jobs/remote*.py: ask RemoteStore " \
                                    "a named question instead (renames_into_place, made_here, set_aside, ...)"



def test_a_store_without_rename_skips_a_corrupt_checkpoint_leaving_it_and_fetches_the_one_before(tmp_path, weights):
    """RemoteStore.set_aside on an object store (no rename: nowhere to move a checkpoint to) sets nothing aside: the
    fetch leaves the damaged one where it is, says it skipped it, and fetches the one before (on a local path it is
    quarantined: test_sync.py's test_fetch_latest_skips_and_quarantines_a_corrupt_remote_checkpoint)."""
    fs = fsspec.filesystem("memory")
    url = f"memory://remote-store-{os.getpid()}-{tmp_path.name}"
    source = tmp_path / "old-scratch"
    try:
        syncer = Syncer(source, url, EXPECTED, keep=3)
        for step in (10, 20):
            save(source, step, weights)
            syncer.sync_newest()
        damaged = f"{url}/step-00000020/{ck.TRAINER_STATE}"
        data = bytearray(fs.cat_file(damaged))
        data[len(data) // 2] ^= 0xFF
        fs.pipe_file(damaged, bytes(data))
        logs: list[str] = []
        fetched = Syncer(tmp_path / "ckpt", url, EXPECTED, log=logs.append).fetch_latest()
        assert fetched == tmp_path / "ckpt" / "step-00000010"
        assert fs.cat_file(damaged) == bytes(data) and not fs.exists(f"{url}/{QUARANTINE}")
        assert [m for m in logs if "step-00000020 is invalid" in m and m.endswith("; skipped")], logs
    finally:
        fs.rm(url, recursive=True)


def test_open_remote_chooses_the_local_half_for_a_local_path_and_the_fsspec_half_for_a_store(tmp_path):
    """One constructor chooses by URL: a plain path, file:// or local:// is a LocalRemote (read as untrusted, written
    at its root's checked descriptor, renamed into place); any other fsspec store is the plain Remote."""
    for url in (str(tmp_path / "r"), f"file://{tmp_path}/r", f"local://{tmp_path}/r"):
        local = open_remote(url)
        assert isinstance(local, LocalRemote) and local.renames_into_place, url
        assert local.root == str(tmp_path / "r")
    store = open_remote(f"memory://remote-store-kind-{os.getpid()}")
    assert not isinstance(store, LocalRemote) and isinstance(store, Remote) and not store.renames_into_place
    assert store.set_aside("step-00000001", "damaged") is None and store.made_here("step-00000001")


def test_a_store_reads_a_pointer_or_manifest_no_further_than_its_bound(tmp_path):
    """Before, Remote.cat ignored max_bytes (fsspec's cat_file reads whole): a 50 MB LATEST or manifest on a store
    was read into memory whole; LocalRemote refused it unread. Both now refuse past the bound alike."""
    from minilmd.names import LATEST, MANIFEST, MANIFEST_MAX_BYTES, POINTER_MAX_BYTES

    fs = fsspec.filesystem("memory")
    url = f"memory://remote-bound-{os.getpid()}-{tmp_path.name}"
    try:
        fs.pipe_file(f"{url}/{LATEST}", b"s" * (POINTER_MAX_BYTES + 1))
        fs.pipe_file(f"{url}/step-00000010/{MANIFEST}", b" " * (MANIFEST_MAX_BYTES + 1))
        remote = open_remote(url)
        assert type(remote) is Remote
        assert remote.read_text(LATEST) is None
        manifest, problems = remote.manifest_or_problems("step-00000010")
        assert manifest is None and any("over" in p for p in problems), problems
        fs.pipe_file(f"{url}/{LATEST}", b"step-00000010\n")
        assert remote.read_text(LATEST) == "step-00000010\n"
    finally:
        fs.rm(url, recursive=True)
