"""A DPO run's step 0 saved by a stopped reference pass, replaced on the remote by a further one (the sync's one
exception to "a step the remote holds is not copied again").

A stop during the reference pass saves step 0 with the sums done so far, its manifest saying how far the pass got
(REFERENCE_PASS: [pairs done, pairs in all]; trainer/loop/dpo_reference.py); every later stop of the pass, and its
end, saves step 0 again, further on. Before, the remote kept the first step 0 it was given: a start on another
machine (a fresh /dev/shm: a Slurm requeue onto another node) went on from that first stop, and a job preempted on a
new node each time never got past it. Now each sync looks at the remote's step 0 too: when it is a stopped pass's and
scratch's step 0 is further on the same pairs (minilmd.checkpoint_contents.further_pass, by the two manifests), the
local one is validated, copied under a temporary name, read back, and put in its place in one step: the remote's
Publishing.publish_unless_taken, which the LoRA base's copy uses too (RENAME_EXCHANGE, or a rename aside on NFS), and
which replaces only what is still, once moved out of the way, a step 0 of this user's behind the copy. The one
replaced is removed as any step of the run is (its manifest naming step 0: remote_made.why_kept). A store without
rename (an object store) cannot replace a step atomically: there the first step 0 stays, said once. Torch-free.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from minilmd import checkpoint as ck
from minilmd.checkpoint_contents import further_pass, pass_words, reference_pass
from minilmd.daemon.jobs.pass_resume import PASS_STEP
from minilmd.daemon.jobs.remote_store import RemoteStore, Scan
from minilmd.names import step_of


class Syncer(Protocol):
    """What of daemon/jobs/sync.py's Syncer this module uses (named here: sync.py imports this module)."""

    local_root: Path

    @property
    def remote(self) -> RemoteStore: ...

    def log(self, msg: str) -> None: ...

    def _once(self, key: tuple[str, str], msg: str) -> None: ...

    def _copy_valid(self, local: Path, scan: Scan, not_copied: str, replacing: bool = False) -> int | None: ...


def sync_further_pass(syncer: Syncer, scan: Scan) -> None:
    """Put scratch's step 0 in place of the remote's when the remote's is a stopped reference pass's and scratch's
    is further on (`scan`: the sync's look at the remote). Raises as the sync's copy does (SyncError: retried)."""
    remote, local = syncer.remote, syncer.local_root / PASS_STEP
    held = _held_pass(syncer, scan)
    if held is None or not local.is_dir() or any(step_of(n) > 0 for n in scan):
        return  # a later step on the remote carries the whole reference: nothing resumes from step 0 any more
    try:
        newer = ck.read_manifest(local)
    except ck.CheckpointError:
        return  # none (pruned meanwhile) or unreadable: validation says why when the sync copies it
    if not isinstance(newer, dict) or not further_pass(newer, held):
        return
    if not remote.renames_into_place:
        syncer._once(("pass", remote.url), f"sync: {remote.show(PASS_STEP)} keeps the DPO reference pass it was "
                                           f"given first ({pass_words(held)}): {remote.url} has no rename to put a "
                                           f"further one in its place whole")
        return
    nbytes = syncer._copy_valid(local, scan, f"sync: {local} not copied over the remote's stopped reference pass",
                                replacing=True)
    if nbytes is None:
        return
    copied = scan[PASS_STEP][0] or {}
    syncer.log(f"sync: {PASS_STEP} ({pass_words(copied)}) copied to {remote.show(PASS_STEP)} in place of the stopped "
               f"reference pass there ({pass_words(held)}) and verified ({nbytes / 1e6:,.1f} MB)")


def _held_pass(syncer: Syncer, scan: Scan) -> dict | None:
    """The manifest of the remote's step 0 when it is intact, this user's and a stopped reference pass's."""
    manifest, problems = scan.get(PASS_STEP, (None, ["none"]))
    if manifest is None or problems or reference_pass(manifest) is None or not syncer.remote.made_here(PASS_STEP):
        return None
    return manifest


def publish_further(remote: RemoteStore, target: str, copied: dict) -> bool:
    """The verified copy at `target` (its manifest `copied`) put in place of the remote's step 0 in one step, only
    while what stands there is a stopped pass behind it (looked at once moved out of the way, where no other writer
    changes it); the one replaced is removed. False when what stands there is no longer that: left as it is."""
    return remote.publish_unless_taken(target, PASS_STEP,
                                       replaceable=lambda name: _behind(remote.manifest(name), copied),
                                       ours=lambda name: remote.manifest(name) == copied)


def _behind(held: dict | None, copied: dict) -> bool:
    return held is not None and further_pass(copied, held)

