"""A stop while staging reads a damaged remote checkpoint again (daemon/jobs/fetch.py READ_AGAIN_AFTER_S): the
staging thread ends at once, nothing set aside. Before (review11c F5), the fetch slept through each pause with
time.sleep and read on, step after damaged step, and the stopping phase waited STOP_WAITS_FOR_STAGING_S for it and
then left the thread behind. The pauses here are 600 s each: the old code's thread outlives any bound below."""
from __future__ import annotations

import threading
from pathlib import Path

from minilmd import names, scratch
from minilmd.config import load_config
from minilmd.daemon.base.runstate import RunState, new_state
from minilmd.daemon.base.worker import Inbox
from minilmd.daemon.jobs.stagingworker import StagingWorker
from minilmd.daemon.jobs.sync import Syncer
from minilmd.names import step_name
from supervisor_helpers import write_config
from sync_helpers import EXPECTED, save, weights  # noqa: F401  (fixtures)
from waiting import wait_until


class Infra:
    """Staging's infra, as far as the fetch asks it: the run's expectation (the tiny model these checkpoints hold)."""

    def expectation(self, cfg, staged):
        return EXPECTED


def test_a_stop_during_the_read_again_pause_ends_the_fetch_at_once_setting_nothing_aside(tmp_path, corpus, weights,
                                                                                         monkeypatch):
    monkeypatch.setattr("minilmd.daemon.jobs.fetch.READ_AGAIN_AFTER_S", (600.0, 600.0))
    cfg = load_config(write_config(tmp_path, corpus, name="stopfetch"))
    cfg.run_dir.mkdir(parents=True)
    scratch.claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)  # as the launch claims it
    remote = Path(cfg.run.remote)
    elsewhere = tmp_path / "elsewhere"
    save(elsewhere, 5, weights)
    Syncer(elsewhere, str(remote), EXPECTED).sync_newest()
    model = remote / step_name(5) / "model.safetensors"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])  # damaged: every read fails
    read_again = threading.Event()

    def log(message: str) -> None:
        if "read again in 600s" in message:
            read_again.set()

    emitted: list[tuple[str, str]] = []
    emit = lambda event, message, **_: emitted.append((event, message))
    run_state = RunState(cfg.run_dir / names.STATE, new_state("stopfetch", cfg.run_dir, "stopfetch.toml"))
    staging = StagingWorker(cfg, Infra(), run_state, emit, Inbox(emit),
                            lambda expected: Syncer(cfg.checkpoint_dir, str(remote), expected, log=log))
    staging.awaiting_remote, staging.fetch_retry_at = cfg.scratch_dir / names.STAGED_CORPUS, 0.0  # fetch only
    staging.tick()  # the fetch starts
    assert read_again.wait(120), "the fetch never paused to read the damaged step again"
    staging.stop()  # the supervisor enters stopping (Supervisor._go)
    wait_until(lambda: staging.worker is not None and staging.worker.done, 120, "the fetch to end on the stop")
    staging.tick()
    assert "stopped: the supervisor stops (nothing set aside)" in (run_state.staging.error or ""), \
        run_state.staging.error
    assert model.is_file() and not (remote / names.QUARANTINE).exists()  # read once, never judged: left in place
    assert not (cfg.checkpoint_dir / step_name(5)).exists()
