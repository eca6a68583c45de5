"""What an interrupted sync left on the remote, cleaned up at the start of the next (Syncer.sync_newest's step 1).

The `.tmp-*` copies and pointer temp files an interrupted sync of this host left (its process gone: its pid, and the
start time and boot the name records, so that a recycled pid, or a process of a later boot, is no live maker; or this
process's) are removed; the remote is a shared path, so a temporary name of another host, or one without a host
(publish_dir's), may be a copy in progress there, and is looked at only once it is STALE_TMP_SECONDS old. Either is
removed only when proven this run's (LocalRemote.rm: remote_made.why_kept, by the run's record; another user may rename
the run's checkpoint to such a name), else left and said. A complete copy whose publish a kill cut before its rename
is published instead (LocalRemote.finish_cut_publish), never removed. One that holds another LoRA base's copy (what
stood at `init`, left by a push killed while it looked at it) is quarantined instead. Torch-free.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from minilmd.daemon.base.runstate import process_alive
from minilmd.daemon.jobs import basecopy
from minilmd.daemon.jobs.remote_local import LocalRemote
from minilmd.daemon.jobs.remote_store import RemoteStore
from minilmd.names import BEST, LATEST, REMOTE_OWNER, TMP_PREFIX
from minilmd.proc_info import this_hosts_remote_maker
from minilmd.tmpnames import atomic_tmp_prefix

STALE_TMP_SECONDS = 24 * 3600
"""A temporary name on the remote that no live sync of this host made is looked at once it is this old (removed only
with remote_made.why_kept's proof: on a local remote, a directory by the run's record, a file holding a pointer, or
the claim's temporary holding this run's claim)."""


def clean_remote_tmp(remote: RemoteStore, base: Path | None, leave: Callable[[str, str], None],
                     once: Callable[[tuple[str, str], str], None], log: Callable[[str], None],
                     claim: bytes | None = None) -> None:
    """Remove (or set aside) the leftovers of interrupted syncs, as the module says; `leave(name, why)` says one left
    as not this run's, `once(key, message)` says a thing once, `log` the rest (the Syncer's). `claim`: this run's
    claim (owner.json's bytes), what the claim's temporary of a supervisor killed as it wrote it holds."""
    ours = basecopy.staged_record_hash(base)  # once, not per leftover
    names = remote.names()
    if isinstance(remote, LocalRemote):
        remote.made.keep_only(set(names))
    for n in names:
        if not n.startswith((TMP_PREFIX, *(atomic_tmp_prefix(f) for f in (LATEST, BEST, REMOTE_OWNER)))):
            continue
        maker = this_hosts_remote_maker(n)  # its start time and boot tell its maker from a later process
        if not ((maker is not None and (maker[0] == os.getpid() or not process_alive(*maker)))
                or remote.age(n) > STALE_TMP_SECONDS):
            continue
        if n.startswith(TMP_PREFIX) and isinstance(remote, LocalRemote) and (said := remote.finish_cut_publish(n)):
            once((n, said), f"sync: {said}")
        elif n.startswith(TMP_PREFIX) and basecopy.another_base_left(remote, n, ours):
            _keep_base_copy(remote, n, once, log)
        elif why := remote.rm(n, file=not n.startswith(TMP_PREFIX),  # a pointer's or the claim's: a file
                              claim=claim if n.startswith(atomic_tmp_prefix(REMOTE_OWNER)) else None):
            leave(n, why)


def _keep_base_copy(remote: RemoteStore, name: str, once: Callable[[tuple[str, str], str], None],
                    log: Callable[[str], None]) -> None:
    """Set aside a temporary name that holds another LoRA base's copy (basecopy.another_base_left): maybe the
    only copy of what older checkpoints, this run's or another's, were trained on."""
    init = remote.show(basecopy.REMOTE_BASE)
    try:
        dest = remote.set_aside(name, f"the copy of another LoRA base than this run's, left under a temporary "
                                       f"name (a push killed while it looked at what stood at {init}?)")
    except OSError as e:
        once((name, "another base"), f"sync: remote {remote.show(name)} holds the copy of another LoRA "
                                     f"base than this run's: never removed, left as it is ({e})")
        return
    log(f"sync: remote {remote.show(name)} holds the copy of another LoRA base than this run's (a push "
        f"killed while it looked at what stood at {init}?): quarantined to {dest}, never removed")
