"""What `minilmd status` says while a run restarts: after a reboot (supervisor and trainer killed, scratch emptied),
through the corpus staged again, the checkpoint fetched from the remote and the new trainer's compile; and after an
ordinary crash of the trainer. Real supervisors with the fake trainer (tests/fake_trainer.py): the corpus is held
on a faultfs mount (tests/faults_fixtures.py) while it stages, the resumed trainer by FAKE_HOLD_RESUMED before its
first step.

On main status showed, all through such a restart, the earlier trainer's ETA and tok/s (as if staging and compiling
were training) and, after the reboot, the local checkpoint metrics.jsonl last named in the emptied scratch.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from faults_fixtures import faultfs  # noqa: F401 - a fixture
from minilmd.config import load_config
from supervisor_helpers import cli, start_supervisor, state, wait_for, wait_or_kill, write_config

pytestmark = pytest.mark.slow  # each test runs supervisors through a restart

ETA = re.compile(r"ETA \d")
WAITS_FOR_RATE = "no ETA until the new trainer logs a step"


def status(run_dir: Path) -> str:
    out = cli("status", str(run_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def status_json(run_dir: Path) -> dict:
    out = cli("status", "--json", str(run_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)["state"]


def progress(run_dir: Path) -> dict:
    return state(run_dir).get("progress") or {}


def last_saved(run_dir: Path) -> int:
    """The step of the last save metrics.jsonl records (a line cut by the kill is no record)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    records = [json.loads(line) for line in lines if line.endswith("\n")]
    return [r for r in records if r.get("kind") == "checkpoint"][-1]["step"]


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def crash(sup, run_dir: Path) -> None:
    """The supervisor and its trainer SIGKILLed, as a machine going down leaves them; returns once both are gone."""
    trainer = state(run_dir)["child"]["pid"]
    sup.send_signal(signal.SIGKILL)
    sup.wait()
    os.killpg(trainer, signal.SIGKILL)
    wait_for(lambda: gone(trainer), 30, "the trainer gone")


def assert_no_old_rate(run_dir: Path) -> str:
    """status shows no ETA and no tok/s, and says why; --json has none either. Returns status's text."""
    said = status(run_dir)
    assert not ETA.search(said) and "tok/s" not in said and WAITS_FOR_RATE in said, said
    shown = status_json(run_dir)["progress"]
    assert shown["eta_s"] is None and shown["tok_s"] is None and shown["rates_awaited_since"], shown
    return said


def assert_new_rate(run_dir: Path, proc) -> None:
    """Once the restarted trainer logs steps, the ETA is its own."""
    wait_for(lambda: progress(run_dir).get("eta_s") is not None or proc.poll() is not None, 60, "a new ETA")
    assert proc.poll() is None
    said = status(run_dir)
    assert ETA.search(said) and WAITS_FOR_RATE not in said, said


def test_status_through_a_restart_after_a_reboot_says_what_is_true(tmp_path, corpus, faultfs):
    shared = faultfs.root / "corpus"
    shutil.copytree(corpus[0], shared)
    config = write_config(tmp_path, (shared, corpus[1]), train={"max_steps": 400, "checkpoint_every": 5,
                                                                 "log_every": 1})
    cfg = load_config(config)
    release = tmp_path / "release"
    first = start_supervisor(config, tmp_path / "first.out", FAKE_STEP_S="0.05")
    try:
        wait_for(lambda: ((state(cfg.run_dir).get("remote_checkpoint") or {}).get("step") or 0) >= 10 and
                 ((state(cfg.run_dir).get("local_checkpoint") or {}).get("step") or 0) >
                 state(cfg.run_dir)["remote_checkpoint"]["step"] and progress(cfg.run_dir).get("eta_s"), 120,
                 "a sync of step 10 or later, a newer local checkpoint, an ETA")
        crash(first, cfg.run_dir)  # the machine goes down
    finally:
        if first.poll() is None:
            first.kill()
    local = last_saved(cfg.run_dir)  # the trainer may have logged a save after state.json was last written
    remote = state(cfg.run_dir)["remote_checkpoint"]["step"]  # what the killed supervisor recorded last
    shutil.rmtree(cfg.scratch_dir)  # the reboot emptied /dev/shm
    held = faultfs.stall("*tokens.bin", seconds=300)
    sup = start_supervisor(config, tmp_path / "restart.out", FAKE_STEP_S="0.05", FAKE_HOLD_RESUMED=str(release))
    try:
        wait_for(lambda: faultfs.hits("stall") and (state(cfg.run_dir).get("staging") or {}).get("state") ==
                 "running", 120, "staging held on the corpus")
        said = assert_no_old_rate(cfg.run_dir)
        assert "staging: running" in said, said
        assert f"local checkpoint: none (step {local} is gone from scratch: emptied, by a reboot?; the trainer " \
               f"resumes from the remote's newest checkpoint (the last sync recorded step {remote}))" in said, said
        shown = status_json(cfg.run_dir)
        assert shown["local_checkpoint"] is None and shown["local_gone"]["step"] == local, shown
        faultfs.remove(held)
        wait_for(lambda: "resuming at step" in _log(cfg.run_dir, 2), 120, "the second attempt resumed")
        fetched = int(_log(cfg.run_dir, 2).split("resuming at step ")[1].split()[0])
        assert fetched >= remote  # the remote's newest: the one recorded, or a later sync's
        wait_for(lambda: progress(cfg.run_dir).get("step") == fetched, 60, "its heartbeat's step in state.json")
        said = assert_no_old_rate(cfg.run_dir)  # compiling: no step logged yet
        assert f"local checkpoint: step {fetched} (fetched from the remote" in said and "gone" not in said, said
        assert f"  step {fetched}/400 " in said, said  # where it resumed, from its heartbeat
        release.touch()
        assert_new_rate(cfg.run_dir, sup)
        sup.send_signal(signal.SIGTERM)
        assert wait_or_kill(sup, 60) == 0, (tmp_path / "restart.out").read_text()[-3000:]
    finally:
        faultfs.clear()
        if sup.poll() is None:
            sup.kill()
            sup.wait()


def test_status_after_a_crash_shows_no_eta_until_the_new_trainer_has_logged_a_step(tmp_path, corpus):
    """No reboot: the trainer killed at step 12 restarts from step 10 and compiles (held) before its first step."""
    config = write_config(tmp_path, corpus, train={"max_steps": 400, "checkpoint_every": 5, "log_every": 1})
    cfg = load_config(config)
    release = tmp_path / "release"
    sup = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.05", MINILMD_FAULT="sigkill@12",
                           FAKE_HOLD_RESUMED=str(release))
    try:
        wait_for(lambda: "resuming at step 10" in _log(cfg.run_dir, 2) or sup.poll() is not None, 120,
                 "the second attempt resumed")
        assert sup.poll() is None, (tmp_path / "sup.out").read_text()[-3000:]
        wait_for(lambda: progress(cfg.run_dir).get("step") == 10, 60, "its heartbeat's step in state.json")
        said = assert_no_old_rate(cfg.run_dir)
        assert "  step 10/400 " in said and "restarts: 1 (last: " in said, said  # killed (its cause: test_child.py)
        release.touch()
        assert_new_rate(cfg.run_dir, sup)
        sup.send_signal(signal.SIGTERM)
        assert wait_or_kill(sup, 60) == 0, (tmp_path / "sup.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


def _log(run_dir: Path, attempt: int) -> str:
    try:
        return (run_dir / "logs" / f"attempt-{attempt:04d}.log").read_text()
    except FileNotFoundError:
        return ""


def test_a_checkpoint_recorded_in_another_scratch_is_said_gone_because_run_scratch_changed(tmp_path, corpus):
    """run.scratch set to a new directory between two supervisors (the old one removed): the checkpoint state.json
    recorded there is said gone because run.scratch changed, not because a reboot emptied scratch."""
    train = {"max_steps": 400, "checkpoint_every": 5, "log_every": 1}
    config = write_config(tmp_path, corpus, train=train)
    cfg = load_config(config)
    first = start_supervisor(config, tmp_path / "first.out", FAKE_STEP_S="0.05")
    try:
        wait_for(lambda: ((state(cfg.run_dir).get("local_checkpoint") or {}).get("step") or 0) >= 5, 120,
                 "a local checkpoint recorded")
        crash(first, cfg.run_dir)  # the machine goes down
    finally:
        if first.poll() is None:
            first.kill()
    shutil.rmtree(cfg.scratch_dir)
    write_config(tmp_path, corpus, train=train, run={"scratch": str(tmp_path / "scratch2")})
    sup = start_supervisor(config, tmp_path / "second.out", FAKE_STEP_S="0.05")
    try:
        log = cfg.run_dir / "supervisor.log"
        wait_for(lambda: "is gone from scratch" in log.read_text() or sup.poll() is not None, 120, "the scratch event")
        said = log.read_text()
        assert "is gone from scratch (run.scratch changed: the run's scratch is now " in said, said[-3000:]
        sup.send_signal(signal.SIGTERM)
        assert wait_or_kill(sup, 60) == 0, (tmp_path / "second.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
