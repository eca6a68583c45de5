"""A stage whose init.from names a finished run with no run.remote, whose scratch checkpoints (its only copy) are
gone, is told so and refused (a final config error: nothing brings a removed scratch back), never left waiting
for "its share"; a scratch where a share is set up to be mounted is still waited for (minilmd/scratch_lost.py).
And `status` of that run no longer says "a reboot may lose them" once they are lost. Before (user report 9, finding
6), the stage waited for ever: `... is not there (its share gone?): the run waits for it, retrying with backoff`."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from minilmd import mount_places, names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.views.status import _checkpoints_line
from minilmd.fsio import atomic_write_json
from minilmd.init_source import InitSourceError, InitSourceUnreachable, resolve
from minilmd.protocol import SUPERVISOR_CONFIG
from supervisor_helpers import cli, write_config


def finished_without_remote(tmp_path: Path, corpus, **run) -> tuple[Path, Path]:
    """A run "mmsft" with no run.remote that has finished (its state.json says so): (its config, its checkpoints)."""
    config = write_config(tmp_path, corpus, name="mmsft", remote=False, run=run)
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    body = new_state("mmsft", cfg.run_dir, str(config))
    body.update(phase="done", outcome={"exit": 0, "phase": "done", "time": time.time(), "reason": "the run finished"})
    atomic_write_json(cfg.run_dir / names.STATE, body)
    return config, cfg.checkpoint_dir


@pytest.mark.parametrize("how", ["removed", "emptied"])
def test_a_stage_after_a_run_whose_only_checkpoints_are_gone_is_refused_saying_so(tmp_path, corpus, how):
    pred, checkpoints = finished_without_remote(tmp_path, corpus)
    checkpoints.parent.mkdir(parents=True)
    (checkpoints.parent / "owner.json").write_text("{}")  # what an rm of the checkpoints alone leaves
    if how == "emptied":
        checkpoints.mkdir()
    with pytest.raises(InitSourceError) as caught:
        resolve(str(pred))
    assert not isinstance(caught.value, InitSourceUnreachable)
    said = str(caught.value)
    assert said.startswith(f"the run mmsft has finished, but it had no run.remote: its checkpoints were only in its "
                           f"scratch ({checkpoints}), and they are gone"), said
    assert "Train mmsft again (give it a run.remote to keep a copy), or point init.from at another checkpoint" in said

    stage = write_config(tmp_path, corpus, name="dpo", init={"from": str(pred)})
    out = cli("run", "--check", str(stage))
    assert out.returncode == SUPERVISOR_CONFIG and "it had no run.remote" in out.stderr, out.stdout + out.stderr
    assert "share" not in out.stdout + out.stderr


def test_a_run_trained_on_another_host_is_waited_for_naming_that_host(tmp_path, corpus):
    """Its scratch is that host's (a cluster node's /dev/shm), which this host cannot see or judge: a wait that names
    the host, never "gone for good" (review11b: a final error for a predecessor trained on another node)."""
    pred, checkpoints = finished_without_remote(tmp_path, corpus)
    checkpoints.parent.mkdir(parents=True)  # as the removed case above: here, a directory this host made
    state = names.STATE
    body = json.loads((load_config(pred).run_dir / state).read_text())
    body["supervisor"]["host"] = "node-17.cluster"
    atomic_write_json(load_config(pred).run_dir / state, body)
    with pytest.raises(InitSourceUnreachable) as caught:
        resolve(str(pred))
    said = str(caught.value)
    assert said.startswith("the run mmsft has finished on host node-17.cluster, with no run.remote"), said
    assert "run this stage on node-17.cluster" in said, said


def test_a_scratch_where_a_share_is_mounted_is_still_waited_for(tmp_path, corpus, monkeypatch):
    pred, checkpoints = finished_without_remote(tmp_path, corpus)
    share = checkpoints.parent  # the run's scratch is a share's mount point (fstab names it), not mounted now
    monkeypatch.setattr(mount_places, "snapshot", lambda: mount_places.MountConfig(frozenset({str(share)})))
    with pytest.raises(InitSourceUnreachable):
        resolve(str(pred))


def test_a_scratch_under_an_empty_directory_nothing_names_is_still_waited_for(tmp_path, corpus):
    (tmp_path / "share").mkdir()  # an empty directory above: a share mounted by hand, gone?
    pred, _ = finished_without_remote(tmp_path, corpus, scratch=str(tmp_path / "share" / "scratch"))
    with pytest.raises(InitSourceUnreachable):
        resolve(str(pred))


def test_status_says_the_only_checkpoints_are_gone_once_they_are(tmp_path):
    state = StateJson.from_dict({"sync": {"state": "off"}, "local_checkpoint": {
        "step": 20, "path": str(tmp_path / "scratch" / "checkpoints" / "step-00000020"), "time": time.time()}})
    gone = _checkpoints_line(state, time.time())
    assert "a reboot may lose them" not in gone
    assert f"checkpoints only in scratch, and the newest, {tmp_path}/scratch/checkpoints/step-00000020, is gone" \
        in gone, gone
    (tmp_path / "scratch" / "checkpoints" / "step-00000020").mkdir(parents=True)
    assert "a reboot may lose them" in _checkpoints_line(state, time.time())


def test_a_scratch_of_a_run_that_ran_on_another_host_is_never_judged_gone_from_here(tmp_path, corpus):
    """review11b: a run trained on another node's local scratch read here as "gone for good (a reboot ...)": its
    path means that node's /dev/shm, not this host's. With the host its state.json names, lost_for_good says no
    (a wait, as for an outage) and the words say where the checkpoints are; this host's own run is judged as before."""
    import socket

    from minilmd.scratch_lost import elsewhere_words, lost_for_good, other_host

    _, checkpoints = finished_without_remote(tmp_path, corpus)
    checkpoints.parent.mkdir(parents=True)
    (checkpoints.parent / "owner.json").write_text("{}")
    assert lost_for_good(checkpoints) and lost_for_good(checkpoints, socket.gethostname())
    assert not lost_for_good(checkpoints, "node17")
    assert other_host("node17") == "node17" and other_host(socket.gethostname()) is None and other_host("") is None
    said = elsewhere_words("mmsft", checkpoints, "node17")
    assert said.startswith(f"the run mmsft has finished on host node17, with no run.remote: its checkpoints are in "
                           f"that host's scratch ({checkpoints}), which this host cannot see; run this stage on "
                           f"node17"), said


def test_status_of_a_run_of_another_host_does_not_call_its_scratch_gone(tmp_path):
    state = StateJson.from_dict({"sync": {"state": "off"}, "supervisor": {"pid": 4242, "host": "node17"},
                                 "local_checkpoint": {"step": 20, "time": time.time(),
                                                      "path": str(tmp_path / "checkpoints" / "step-00000020")}})
    line = _checkpoints_line(state, time.time())
    assert "is gone" not in line, line
    assert (f"checkpoints only in scratch on host node17, the newest at {tmp_path}/checkpoints/step-00000020: a "
            f"reboot of node17 may lose them; not looked at from here") in line, line
