"""What `minilmd status` reads of a run beyond state.json, through its run directory's descriptor: its own config
(run.toml, minilmd/run_config_copy.py), and from it the init.from lineage behind its checkpoints, a note when its
corpus is another user's now, and what its local run.remote holds now for a run no supervisor keeps the record of
(RunContext: run.toml read once, however many lines need it).
Each look at shared storage is bounded (daemon/views/pathlooks.py): a share that does not answer is left out of the
line, and said in a note of its own."""
from __future__ import annotations

import functools
import os
from pathlib import Path

from minilmd.bounded import SHARED_STORAGE_PROBE_S
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.views.pathlooks import Looks
from minilmd.daemon.views.remotenow import RemoteNow, look_now
from minilmd.dirfd import Dir


class RunContext:
    """One run as status reads it beyond state.json: its run.toml read once, at the first line that needs it (a run
    no supervisor keeps the record of, a lineage, a corpus note), however many ask."""

    def __init__(self, run: Dir | Path):
        self.run = run

    @functools.cached_property
    def config(self):
        """The run's run.toml (minilmd/run_config_copy.py: through its run directory's descriptor, the one judged,
        the run's user's or ours); None when it cannot be read (a link, a FIFO, a third user's file)."""
        from minilmd.config import ConfigError
        from minilmd.run_config_copy import run_config_of

        run = self.run
        try:
            return run_config_of(run.path, run.fd) if isinstance(run, Dir) else run_config_of(run)
        except (ConfigError, OSError, ValueError):  # init_place.Refused: a link, a FIFO, a third user's file
            return None

    def remote_now(self, state: StateJson, alive: bool, looks: Looks | None = None) -> RemoteNow | None:
        """What the run's local run.remote holds now, for a run no supervisor keeps the record of (remotenow.py)."""
        cfg = None if alive or state.remote_checkpoint is None else self.config
        return look_now(state, cfg.run.remote, alive, looks) if cfg is not None else None

    def lineage_lines(self, state: StateJson | None = None, looks: Looks | None = None) -> list[str]:
        """init.from behind the newest local checkpoint, or once scratch is gone (removed at the end, a reboot)
        behind the one state.json records synced to the config's run.remote, stage by stage
        (daemon/phases/initwait.py lineage). Read in a bounded thread: a chain on a share that does not answer is
        left out (said through `looks`); whether run.toml's scratch is still the run's is looked at as pathlooks.py
        looks."""
        from minilmd.daemon.phases.initwait import lineage
        from minilmd.scratch_root import not_looked_in

        if (cfg := self.config) is None:
            return []
        run = self.run
        owner = os.fstat(run.fd).st_uid if isinstance(run, Dir) else None  # the run's user (root reads hers)
        taken = (looks or Looks()).look("scratch", cfg.scratch_dir, not_looked_in, cfg.scratch_dir, owner,
                                        default="did not answer")
        local = None if taken else cfg.checkpoint_dir  # another user's, or stalled: not the run's
        synced = _synced(cfg.run.remote, state)
        chain = (looks or Looks()).look("the lineage (init.from's chain) from", local or synced, lineage, local, 8,
                                        synced, default=None, timeout_s=SHARED_STORAGE_PROBE_S)
        return [f"  lineage: {' <- '.join(chain)}"] if chain else []

    def corpus_owner_lines(self, looks: Looks | None = None) -> list[str]:
        """A note when the run's data.prepared is another user's now (corpus_meta.owner_note; allowed, but said),
        read in a bounded thread: a share that does not answer is left out (said through `looks`)."""
        from minilmd.corpus_meta import owner_note

        cfg = self.config
        note = (looks or Looks()).look("data.prepared", cfg.data.prepared, owner_note, cfg.data.prepared, default="",
                                       timeout_s=SHARED_STORAGE_PROBE_S) if cfg is not None else ""
        return [f"  note: {note}"] if note else []


def _synced(remote: str | None, state: StateJson | None) -> Path | None:
    """The checkpoint state.json records synced last, when it is on the config's run.remote and that is a local
    path: read there as any checkpoint of the chain is (source_state), never taken on state.json's word alone."""
    from minilmd.daemon.base.runstate import names_remote
    from minilmd.urls import is_url

    synced = state.remote_checkpoint if state is not None else None
    if synced is None or not remote or is_url(remote) or not names_remote(synced.path, remote):
        return None
    return Path(synced.path)
