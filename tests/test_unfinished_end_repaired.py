"""A run whose last sync fails after its step is on the remote is never left unfinished for good (reports fault9 F1).

On main the supervisor ended `failed` (exit 1, for systemd to start it again), and every later `minilmd run` said
"run is done ... nothing to do", exit 0 (daemon/jobs/rundone.py counted a synced checkpoint at the budget as done
whatever the recorded ending): the missing work was never done and a stage whose init.from named the run waited for
ever. Seen with real processes on the fault-injecting FUSE remote (tests/faultfs.py):
- the remote's LATEST rename dropped (a flaky NFS server), then scratch wiped (a reboot): LATEST stayed at an older
  step for good; now the restart fetches the step, repoints LATEST and ends finished;
- a LoRA run whose base copy push fails (EIO): no restart pushed it; now the restart does;
- a LoRA run whose base copy push finds the remote full (ENOSPC): the run failed at the first try of its last sync;
  now it waits for room, as for a checkpoint's copy, and ends finished once there is.
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from minilmd import names, protocol
from minilmd.config import load_config
from minilmd.init_source import Predecessor, predecessor_report
from supervisor_helpers import cli, run_supervisor, start_supervisor, state, wait_or_kill, write_config
from sync_helpers import weights  # noqa: F401  (fixture)
from waiting import wait_until

LORA = {"rank": 4, "alpha": 8.0}


def _fake_pth(where: Path) -> Path:
    """A file init.from accepts as a MiniMind .pth before torch reads it (the fake trainer never loads it)."""
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_bytes(b"\0" * 300_000)
    return where


def _latest(remote: Path) -> str:
    return (remote / names.LATEST).read_text().strip() if (remote / names.LATEST).is_file() else ""


def _ended(run_dir: Path) -> str | None:
    return protocol.how_ended(state(run_dir))


def _relaunched_whole(config: Path, tmp_path: Path, remote: Path, lora: bool) -> None:
    """`minilmd run` again, as systemd's restart: not "done" while the remote lacks the run's end; it repairs the
    remote and ends finished, after which the run is done."""
    run_dir = load_config(config).run_dir
    checked = cli("run", "--check", str(config))
    assert "run is done" not in checked.stdout, checked.stdout  # main: "run is done (step 30/30; ...)"
    assert run_supervisor(config, tmp_path, timeout=240) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    assert _ended(run_dir) == protocol.ENDED_FINISHED, state(run_dir).get("outcome")
    assert _latest(remote) == "step-00000030"
    if lora:
        assert (remote / "init" / names.INIT_RECORD).is_file(), sorted(p.name for p in remote.iterdir())
    assert "run is done (step 30/30" in cli("run", "--check", str(config)).stdout  # whole now: done


@pytest.mark.slow
@pytest.mark.fuse
def test_a_lost_latest_rename_then_a_reboot_is_repaired_by_the_restart(tmp_path, corpus, faultfs):
    remote = faultfs.root / "remote"
    config = write_config(tmp_path, corpus, name="lost", remote=False, run={"remote": str(remote)})
    stage = load_config(write_config(tmp_path, corpus, name="next", init={"from": str(config)}))
    cfg = load_config(config)
    faultfs.drop_rename("*LATEST*")  # the rename answers success and does nothing; the read-back catches it
    assert run_supervisor(config, tmp_path, timeout=240) == 1, (tmp_path / "supervisor.out").read_text()[-3000:]
    assert faultfs.hits("drop") and (remote / "step-00000030").is_dir() and _latest(remote) != "step-00000030"
    assert _ended(cfg.run_dir) == protocol.ENDED_FAILED
    report = predecessor_report(Predecessor("lost", cfg.run_dir, Path(stage.init.from_)))
    assert report.outcome == "waiting", report  # not finished: the stage after it waits

    faultfs.clear()
    shutil.rmtree(cfg.scratch_dir)  # the reboot: /dev/shm emptied
    _relaunched_whole(config, tmp_path, remote, lora=False)
    report = predecessor_report(Predecessor("lost", cfg.run_dir, Path(stage.init.from_)))
    assert report.outcome == "done", report  # the stage after it goes on


@pytest.mark.slow
@pytest.mark.fuse
def test_a_lora_base_push_that_failed_is_made_by_the_restart(tmp_path, corpus, faultfs):
    remote = faultfs.root / "remote"
    base = _fake_pth(tmp_path / "share" / "base.pth")
    config = write_config(tmp_path, corpus, name="eio", remote=False, run={"remote": str(remote)},
                          init={"from": str(base)}, lora=LORA)
    cfg = load_config(config)
    faultfs.fail_writes("*init*", errno.EIO)  # the base's copy, and only it, fails
    assert run_supervisor(config, tmp_path, timeout=240) == 1, (tmp_path / "supervisor.out").read_text()[-3000:]
    assert faultfs.hits("error") and _latest(remote) == "step-00000030" and not (remote / "init").exists()
    outcome = state(cfg.run_dir)["outcome"]
    assert outcome["ended"] == protocol.ENDED_FAILED and "LoRA base" in outcome["reason"], outcome

    faultfs.clear()
    _relaunched_whole(config, tmp_path, remote, lora=True)


@pytest.mark.slow
@pytest.mark.fuse
def test_a_lora_base_push_on_a_full_remote_waits_for_room_and_ends_finished(tmp_path, corpus, faultfs):
    remote = faultfs.root / "remote"
    base = _fake_pth(tmp_path / "share" / "base.pth")
    config = write_config(tmp_path, corpus, name="full", remote=False, run={"remote": str(remote)},
                          init={"from": str(base)}, lora=LORA)
    cfg = load_config(config)
    faultfs.fail_writes("*init*", errno.ENOSPC)  # the share is full while the base's copy is pushed
    proc = start_supervisor(config, tmp_path / "supervisor.out")
    try:
        wait_until(lambda: state(cfg.run_dir).get("reason", "").startswith(protocol.FINAL_SYNC_WAITING)
                   or proc.poll() is not None, timeout=240, what="the last sync waiting for room")
        said = state(cfg.run_dir)
        assert proc.poll() is None and said["phase"] == "stopping", said.get("outcome")  # main: failed, exit 1
        assert "remote full for the LoRA base's copy (needs 0.3 MB" in said["reason"], said["reason"]
        assert _latest(remote) == "step-00000030" and not (remote / "init").exists()
        faultfs.clear()  # room again
        assert wait_or_kill(proc, 240) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    finally:
        faultfs.clear()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _ended(cfg.run_dir) == protocol.ENDED_FINISHED
    assert (remote / "init" / names.INIT_RECORD).is_file() and _latest(remote) == "step-00000030"
    assert "run is done (step 30/30" in cli("run", "--check", str(config)).stdout


@pytest.mark.parametrize("outcome, latest, done", [
    ({"exit": 0, "phase": "done", "reason": "the run finished"}, "step-00000030", True),  # an older version's file
    ({"exit": 0, "phase": "done", "reason": "the run finished", "ended": "finished"}, "step-00000030", True),
    ({"exit": 0, "phase": "done", "reason": "the run finished", "ended": "finished"}, "step-00000020", False),
    ({"exit": 1, "phase": "failed", "reason": "finished, but ...", "ended": "failed"}, "step-00000030", False),
    (None, "step-00000030", False),  # its supervisor killed before it wrote how it ended
])
def test_done_is_a_finished_record_and_a_whole_remote(tmp_path, corpus, weights, outcome, latest, done):
    from minilmd.daemon.base.runstate import new_state
    from minilmd.daemon.jobs.rundone import done_line
    from minilmd.fsio import atomic_write_json
    from minilmd.trainer.checkpoint import save as ckpt_io

    cfg = load_config(write_config(tmp_path, corpus, name="rec"))
    remote = Path(cfg.run.remote)
    ckpt_io.save(remote, 30, weights[0], weights[1], {"step": 30})  # whole: the done check reads its manifest too
    (remote / names.LATEST).write_text(latest + "\n")
    cfg.run_dir.mkdir(parents=True)
    body = new_state("rec", cfg.run_dir, str(cfg.source))
    body.update(phase=(outcome or {}).get("phase", "training"), outcome=outcome)
    atomic_write_json(cfg.run_dir / names.STATE, body)
    assert bool(done_line(cfg, 30, f"remote: {remote / 'step-00000030'}")) is done
