"""Will the checkpoints fit on run.remote? `run --check` and the launch compare a local remote's file system with
the checkpoints its syncs hold at once. A sync copies the new checkpoint in full before retention removes the oldest
(daemon/jobs/sync.py: copy, LATEST, then retention), so the remote holds up to sync.keep + 1 of this run's
checkpoints, and never fewer than two across a sync. One checkpoint's size is estimated from the model, as scratch's
(scratch_room.checkpoint_bytes).

- A file system too small for two checkpoints can never take a second sync: refused (a config error, as a scratch
  that can never hold the run: `remote_room_problems`).
- One with less room now than sync.keep + 1 checkpoints (its free space and this run's checkpoints there): a note
  (`remote_room_note`): others' files may go; meanwhile the syncs say `remote full (needs X, free Y)` and retry,
  training goes on and the checkpoints stay in scratch (daemon/jobs/syncworker.py).
A remote behind a URL, or a LoRA run (its checkpoints hold adapters only, far under the estimate), is not judged.
Torch-free.
"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from minilmd.bounded import bounded_probe
from minilmd.config import RunConfig
from minilmd.config_values import out_of_range
from minilmd.corpus_meta import read_corpus_meta
from minilmd.fmt import fmt_mb as mb
from minilmd.names import CORPUS_TOKENIZER, is_step_name
from minilmd.untrusted import listed
from minilmd.urls import is_url


def remote_room_problems(cfg: RunConfig) -> list[str]:
    """The refusal of a local remote whose file system cannot hold the two checkpoints a sync needs at once."""
    room = _room_of(cfg)
    if room is None:
        return []
    one, _, capacity = room
    if capacity >= 2 * one:
        return []
    return [f"run.remote {cfg.run.remote}: its file system holds {mb(capacity)} in all, less than the 2 "
            f"checkpoints of about {mb(one)} each (estimated from [model]) that a sync needs at once: the new one is "
            f"copied in full before the oldest is removed, so no sync after the first could fit; set run.remote to a "
            f"directory on a larger file system"]


def remote_room_note(cfg: RunConfig) -> str | None:
    """A `run --check` note when the remote has less room now than the sync.keep + 1 checkpoints its syncs hold."""
    room = _room_of(cfg)
    if room is None:
        return None
    one, room_now, capacity = room
    keep = cfg.sync.keep
    if capacity < 2 * one or room_now >= (keep + 1) * one:
        return None  # refused (remote_room_problems), or room enough
    return (f"run.remote {cfg.run.remote}: {mb(room_now)} of room there now (its free space and this run's "
            f"checkpoints there), under the {keep + 1} checkpoints of about {mb(one)} (estimated from [model]) its "
            f"syncs hold at once (sync.keep = {keep}, + 1: the new one is copied in full before the oldest is "
            f"removed): once it is full the syncs say `remote full (needs X, free Y)` and retry, training goes on and "
            f"the checkpoints stay in scratch; free space there or lower sync.keep")


def _room_of(cfg: RunConfig) -> tuple[int, int, int] | None:
    """(one checkpoint's bytes, the room there now, the file system's capacity) of a local remote; None when it is
    not judged (no remote, a URL, a LoRA run, values out of range) or cannot be measured (a stalled mount)."""
    remote = cfg.run.remote
    if not remote or is_url(remote) or cfg.lora.enabled or out_of_range(cfg):
        return None
    answered, room, _ = bounded_probe(_measure, cfg)
    return room if answered else None


def _measure(cfg: RunConfig) -> tuple[int, int, int] | None:
    from minilmd.daemon.jobs.scratch_room import checkpoint_bytes

    meta = read_corpus_meta(cfg.data.prepared) if cfg.data.prepared and not is_url(cfg.data.prepared) else None
    files = meta.get("files") if isinstance(meta, dict) else None
    entry = files.get(CORPUS_TOKENIZER) if isinstance(files, dict) else None
    size = entry.get("size") if isinstance(entry, dict) else None
    one = checkpoint_bytes(cfg, size if isinstance(size, int) else 0)
    place = Path(remote := cfg.run.remote)
    while not place.exists() and place.parent != place:  # --check makes nothing: its nearest existing directory
        place = place.parent
    st = os.statvfs(place)
    capacity = (st.f_blocks - (st.f_bfree - st.f_bavail)) * st.f_frsize  # what a user may fill
    held = _steps_bytes(Path(remote)) if place == Path(remote) else 0
    return one, st.f_bavail * st.f_frsize + held, capacity


def _steps_bytes(remote: Path) -> int:
    """Bytes of the step directories directly under the remote (this run's, once it synced there: retention
    removes them as new ones come). Listed bounded (a place others may fill), by lstat: no link followed."""
    total = 0
    for name in listed(remote):
        step = remote / name
        if not is_step_name(name) or not stat.S_ISDIR(os.lstat(step).st_mode):
            continue
        for file in listed(step):
            with contextlib.suppress(FileNotFoundError):  # a retention or a sync under way
                st = os.lstat(step / file)
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total
