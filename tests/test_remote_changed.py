"""`run.remote` changed in the config after the run synced to another remote: the previous supervisor's state.json
records a step on the old remote (A), the config now names B. That step is not B's: the new supervisor does not
adopt it as the remote checkpoint (daemon/base/runstate.py `RunState.adopt`) and says so in an `adopt` event naming
A. On main it was adopted as is: `status` showed A's step as the remote's, `minilmd stop` exited 0 ("the newest
checkpoint is on the remote") for a run whose new remote held nothing, and every other reader of the remote step
(a LoRA base's fetch waiting for a remote that "synced before", the finish of an attempt "saved on the remote",
a Slurm requeue's resume step, the early sync) judged B by A's step.
"""
from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.runfiles import RunFiles
from minilmd.daemon.views import status as views
from minilmd.fsio import atomic_write_json
from reliability_helpers import event_texts
from supervisor_helpers import cli, run_supervisor, write_config


def previous_state(run_dir: Path, remote: str, step: int = 20) -> None:
    """state.json as a previous supervisor left it (killed: no outcome), its last sync step `step` to `remote`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    old = new_state("s", run_dir, "s.toml")
    old["remote_checkpoint"] = {"step": step, "time": time.time() - 60, "verified": True,
                                "path": f"{remote}/{names.step_name(step)}"}
    atomic_write_json(run_dir / names.STATE, old)


def adopted(tmp_path: Path, corpus, recorded_on: str, **config):
    """A new supervisor's run files for the config (run.remote: tmp/s/remote unless `config` says) after a previous
    one that synced to `recorded_on`: its RunState once the previous state.json is adopted."""
    config = write_config(tmp_path, corpus, **config)
    cfg = load_config(config)
    previous_state(cfg.run_dir, recorded_on)
    files = RunFiles(cfg, cfg.run_dir, config, echo=False)
    try:
        files.adopt_previous_state(cfg.run.remote)
        files.state.save()
    finally:
        files.events.close()
    return cfg, files.state


def test_a_step_recorded_on_another_remote_is_not_adopted_and_the_old_remote_is_named(tmp_path, corpus):
    old = str(tmp_path / "old-share" / "remote")
    cfg, state = adopted(tmp_path, corpus, old)
    assert state.remote_checkpoint is None
    said = [m for m in event_texts(cfg.run_dir, "adopt") if old in m]
    assert len(said) == 1 and "step 20" in said[0] and cfg.run.remote in said[0], event_texts(cfg.run_dir)
    out = io.StringIO()
    views.status(cfg.run_dir, out=out)
    assert "remote: none" in out.getvalue() and "remote: step 20" not in out.getvalue(), out.getvalue()


def test_a_step_recorded_on_the_same_remote_is_adopted(tmp_path, corpus):
    """The same remote, written with a trailing slash in the config: its step stays the run's remote checkpoint
    (what a restart whose remote is out of reach waits for: tests/test_remote_wait.py)."""
    remote = str(tmp_path / "s" / "remote")
    cfg, state = adopted(tmp_path, corpus, remote, run={"remote": remote + "/"})
    assert state.remote_checkpoint is not None and state.remote_checkpoint.step == 20
    assert not event_texts(cfg.run_dir, "adopt"), event_texts(cfg.run_dir)


@pytest.mark.slow
def test_a_run_moved_to_a_remote_it_cannot_sync_to_is_not_reported_synced(tmp_path, corpus):
    """A run that synced step 20 to A, started again with run.remote B, a link to nowhere (its share not mounted):
    the final sync to B fails (exit 1). `status` and `stop` then say that B holds nothing of it; on main `status`
    showed `remote: step 20 (verified)` and `stop` exited 0, the newest checkpoint "on the remote"."""
    config = write_config(tmp_path, corpus, train={"max_steps": 20})
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    old = load_config(config).run.remote
    assert (Path(old) / "step-00000020").is_dir()
    new = tmp_path / "new-share" / "remote"
    new.parent.mkdir()
    new.symlink_to(tmp_path / "nfs" / "remote")
    config = write_config(tmp_path, corpus, train={"max_steps": 20}, run={"remote": str(new)})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path) == 1, (tmp_path / "supervisor.out").read_text()[-3000:]

    status = cli("status", str(cfg.run_dir)).stdout
    assert "remote: none" in status and "remote: step 20" not in status, status
    stopped = cli("stop", str(cfg.run_dir))
    assert stopped.returncode == 3, stopped.stdout + stopped.stderr  # NOT SYNCED: step 20 is only in scratch
    assert "NOT SYNCED" in stopped.stdout and "the remote has no checkpoint" in stopped.stdout, stopped.stdout
    said = [m for m in event_texts(cfg.run_dir, "adopt") if old in m]
    assert said and str(new) in said[0], event_texts(cfg.run_dir)
