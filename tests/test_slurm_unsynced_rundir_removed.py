"""A Slurm job whose run.dir is removed while its last sync waits (phase stopping: rundirwatch marks it removed,
but stops nothing more, the trainer having ended) and whose last sync then gives up: the run ends as the
removed-run.dir rule says (exit 73, final), nothing kept in run.dir, no `scontrol requeue`. Before (review12b F2),
daemon/ending.py's unsynced path copied the checkpoint into a run.dir the copy made again and requeued the job.
The supervisor's ending (daemon/ending.py `Ending._finish`) with its real parts (RunState, EventLog, RunDirWatch,
SlurmJob whose `scontrol` is a fake on PATH recording its calls); only the phase change and the failure are
recorded instead of done."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

from minilmd import protocol
from minilmd.daemon.base.runstate import EventLog, RunState
from minilmd.daemon.base.states import Cause, Phase
from minilmd.daemon.base.statesections import RemoteCheckpoint
from minilmd.daemon.ending import Ending
from minilmd.daemon.phases.rundirwatch import RunDirWatch
from minilmd.daemon.slurm.job import Allocation, SlurmJob
from slurm_helpers import fake_scontrol
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - the fixture

GAVE_UP = "the last sync waited 15 min: run.remote R is full"


class Ended(Ending):
    """The supervisor's ending over its real parts; `_fail` and `_go` (the supervisor's) record what they are told."""

    def __init__(self, cfg, slurm: SlurmJob, state: RunState, events: EventLog, room: RunDirWatch):
        self.cfg, self.slurm, self.state, self.events, self.room = cfg, slurm, state, events, room
        self.loop = SimpleNamespace(stop_requested=False, last_cause=Cause.DONE, ended=None, exit_status=0)
        self.sync = SimpleNamespace(syncer=SimpleNamespace(expected=EXPECTED), final_refusal="")  # no claim refused
        self.files = SimpleNamespace(record_outcome=lambda *a: None)  # state.json's outcome: run.dir is gone
        self.ends: list[tuple] = []

    def _fail(self, status: int, message: str) -> None:
        self.ends.append((status, message))

    def _go(self, new: Phase, reason: str, **details) -> None:
        self.ends.append((new, reason))


def test_a_run_dir_removed_during_the_last_sync_ends_73_with_nothing_kept_nor_requeued(
        tmp_path, monkeypatch, weights):
    env, calls = fake_scontrol(tmp_path, "42")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    cfg = SimpleNamespace(checkpoint_dir=tmp_path / "scratch" / "checkpoints", scratch_dir=tmp_path / "scratch",
                          run_dir=run_dir, scratch_is_default=True, run=SimpleNamespace(remote="R"))
    save(cfg.checkpoint_dir, 30, weights)
    state, events = RunState(run_dir / "state.json", {}), EventLog(run_dir, echo=False)
    state.remote_checkpoint = RemoteCheckpoint(step=10)
    room = RunDirWatch(cfg, run_dir, state, events)
    slurm = SlurmJob(Allocation("42", ["n1"], [0]), state, lambda *a, **k: None)
    ending = Ended(cfg, slurm, state, events, room)
    shutil.rmtree(run_dir)  # during the last sync's wait: the loop's tick sees it
    state.save()
    room.watch(Phase.STOPPING)
    assert room.removed and not room.stopping
    ending._finish(GAVE_UP)

    assert len(ending.ends) == 1, ending.ends
    status, words = ending.ends[0]
    assert status == protocol.SUPERVISOR_RUN_DIR_FULL, ending.ends
    assert f"run.dir {run_dir} was removed while the run ran" in words and GAVE_UP in words, words
    assert not run_dir.exists()  # never made again by the copy
    assert "requeue" not in (calls.read_text() if calls.exists() else "")
    assert (cfg.checkpoint_dir / "step-00000030").is_dir()  # the checkpoint stays in scratch
