"""A supervised run back on a scratch it kept that is older than run.remote (daemon/jobs/scratch_behind.py), with
the real trainer: it trains to step 4 (the /dev/shm kept then), goes on to a stop past step 8 (another machine, or
the same one later: synced), and starts again on the kept scratch at step 4. Before, the start resumed
from scratch's 4 and computed steps 5 on again in silence, its syncs a second history over the remote's; now
staging fetches the remote's newer step beside scratch's, says so, `run --check` names it, and the run ends with the
weights of an undisturbed run, bit for bit. The rule's own cases: tests/test_scratch_behind.py."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from held import PAUSING_TRAINER, held_at, pending
from minilmd import checkpoint as ck
from minilmd import checkpoint_dirs
from minilmd.config import load_config
from minilmd.names import FAULT_ENV, LATEST, TRAINER_CMD_ENV, step_name, step_or_none
from supervisor_helpers import cli, env_for, events, model_sha, run_supervisor, start_supervisor, wait_for
from trainer_corpus import read_metrics

pytestmark = pytest.mark.slow  # three supervised starts of the real trainer, and an undisturbed run to compare
LONG = 300



def kept_at_step_4(scratch: Path, kept: Path) -> None:
    """The machine's /dev/shm as it was at step 4, kept: scratch copied (its trainer held still) without the
    checkpoints after step 4 (step 8's write may be under way: held in the trainer's writer thread too)."""
    def later(where: str, entries: list[str]) -> list[str]:
        if Path(where).name != "checkpoints":
            return []
        return [e for e in entries if e.startswith((".tmp", "step-")) and e != step_name(4)]
    shutil.copytree(scratch, kept, symlinks=True, ignore=later)
    (kept / "checkpoints" / LATEST).write_text(step_name(4) + "\n")
    ck.validate(kept / "checkpoints" / step_name(4))  # written whole: step 8's save waited for it


def test_a_start_on_a_kept_scratch_older_than_the_remote_resumes_from_the_remotes_and_ends_bit_identical(
        tmp_path, undisturbed):
    straight = undisturbed()
    # a trainer held still (SIGSTOP) is no hang here: the test's looks take the time they take under load
    config = straight.config_like(tmp_path, "back", remote=True, restart={"hang_timeout": "600s"})
    cfg = load_config(config)
    run_dir, remote, kept = cfg.run_dir, Path(cfg.run.remote), tmp_path / "kept-scratch"
    pausing = {FAULT_ENV: "pause@10", TRAINER_CMD_ENV: f"{sys.executable} {PAUSING_TRAINER}"}
    sup = start_supervisor(config, tmp_path / "supervisor.out", fake=False, **pausing)
    try:
        trainer = held_at(run_dir, "pause@10")
        kept_at_step_4(cfg.scratch_dir, kept)
        stop = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "stop", str(run_dir)], env=env_for(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: pending(trainer, signal.SIGTERM), LONG, "the SIGTERM of the stop")
        os.kill(trainer, signal.SIGCONT)  # it saves at the step's end and exits: the stop's last sync
        assert stop.wait(LONG) == 0, stop.communicate()[0]
        assert sup.wait(LONG) == 0, (tmp_path / "supervisor.out").read_text()
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    newer = step_or_none(checkpoint_dirs.read_latest(remote))
    assert newer is not None and 8 < newer < 16, newer

    shutil.rmtree(cfg.scratch_dir)  # back on the kept scratch, at step 4
    shutil.copytree(kept, cfg.scratch_dir, symlinks=True)
    checked = cli("run", "--check", str(config), timeout=LONG)
    assert f"resumes from step {newer} (remote: {remote / step_name(newer)}: newer than scratch's step 4; staging " \
           f"fetches it beside scratch's" in checked.stdout, checked.stdout + checked.stderr  # before: step 4
    trained_before = len(read_metrics(run_dir, "train"))
    assert run_supervisor(config, tmp_path, timeout=600, fake=False) == 0, (tmp_path / "supervisor.out").read_text()

    fetched = [e["message"] for e in events(run_dir) if e["event"] == "fetch" and "newer: fetched" in e["message"]]
    assert len(fetched) == 1 and fetched[0].startswith(
        f"scratch held step 4; run.remote holds step {newer}, newer: fetched {cfg.checkpoint_dir / step_name(newer)}")
    steps = [m["step"] for m in read_metrics(run_dir, "train")[trained_before:]]
    assert steps == list(range(newer + 1, 17)), steps  # before: 5, 6, ... again, from scratch's step 4
    assert checkpoint_dirs.read_latest(remote) == step_name(16)
    assert model_sha(remote / step_name(16)) == model_sha(straight.checkpoint)
