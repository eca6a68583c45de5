"""A last sync held mid-copy, for the tests of the stopping phase's wait (test_last_sync_slow.py) and of the Slurm
job's cut at its end (test_slurm_lastsync.py): a SyncWorker whose one Syncer reports a 2.4 GB copy on its ReadWatch
and runs until the test releases it."""
from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator

from minilmd.config import RunConfig
from minilmd.daemon.base.knobs import Knobs
from minilmd.daemon.base.runstate import RunState
from minilmd.daemon.base.worker import Inbox, ReadWatch
from minilmd.daemon.infra import Infra
from minilmd.daemon.jobs.sync_errors import SyncResult
from minilmd.daemon.jobs.syncworker import SyncWorker


class HeldSyncer:
    """A Syncer whose copy runs until `release` is set, reporting what it does on its ReadWatch as sync.py does;
    a test may move its clock (when it last moved a byte) by hand."""

    base_problem = None  # no LoRA base
    copying = None

    def __init__(self):
        self.watch = ReadWatch()
        self.started, self.release = threading.Event(), threading.Event()

    def sync_newest(self) -> SyncResult:
        self.watch.reading("copying step-00000004 to /nfs/r/.tmp-step-00000004", 2_400_000_000)
        self.started.set()
        self.release.wait(60)
        return SyncResult(step=4, path="/nfs/r/step-00000004", verified=True, copied=True)


class OneSyncer(Infra):
    def __init__(self, syncer: HeldSyncer):
        self.the_syncer = syncer

    def syncer(self, cfg, expected, log):
        return self.the_syncer

    def prune_local(self, root, keep, protect, log):
        return []


@contextlib.contextmanager
def last_sync_running(tmp_path, knobs: Knobs | None = None) -> Iterator[tuple[SyncWorker, HeldSyncer, list[str]]]:
    """The stopping phase's last sync of step 4 begun, its copy held (released on leaving)."""
    cfg = RunConfig()
    cfg.run.scratch, cfg.run.remote = str(tmp_path / "scratch"), "/nfs/r"
    ckpt = cfg.checkpoint_dir / "step-00000004"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text(json.dumps({"files": {"model.safetensors": {"size": 2_400_000_000}}}))
    said: list[str] = []
    syncer = HeldSyncer()
    sync = SyncWorker(cfg, OneSyncer(syncer), RunState(tmp_path / "state.json", {}),
                      lambda kind, msg, **d: said.append(msg), Inbox(lambda *a, **k: None),
                      *([knobs] if knobs is not None else []))
    try:
        assert sync.final_sync(None) is None  # begun
        assert syncer.started.wait(30)
        yield sync, syncer, said
    finally:
        syncer.release.set()
