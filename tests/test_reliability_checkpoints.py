"""A corrupted newest checkpoint, local or remote, is quarantined with its reason and the previous one is used.

- Local, `minilmd train` (the real trainer, a tiny model): the newest checkpoint's weights are damaged in place
  (same size, other bytes: only the sha256 shows it). The trainer moves it to quarantine/ with a reason, resumes
  from the one before, and recomputes the same step with bit-identical weights.
- Remote, `minilmd run` with empty scratch (a new machine): the remote's newest checkpoint is damaged; the fetch
  quarantines it on the remote, fetches the previous one, repoints LATEST, and the run finishes with the weights
  of an undisturbed run.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from in_process import train_in_process
from minilmd import checkpoint, checkpoint_dirs
from minilmd.config import load_config
from minilmd.names import QUARANTINE, REASON_FILE
from reliability_helpers import event_texts, fake_weights_of, remote_of_an_earlier_run, undisturbed_fake_weights
from supervisor_helpers import (
    READS_THE_SAME,
    model_sha,
    run_supervisor,
    start_supervisor,
    state,
    wait_for,
    wait_or_kill,
    write_config,
)

pytestmark = pytest.mark.slow  # every test runs supervised runs end to end


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    path.write_bytes(bytes(data))



def train(config: Path) -> subprocess.CompletedProcess:
    out = train_in_process(config)  # the test's process: no signal or fault here (tests/in_process.py)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out


def test_a_corrupted_newest_local_checkpoint_is_quarantined_and_the_previous_one_used(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False,
                          train={"max_steps": 12, "checkpoint_every": 4, "micro_batch_size": 4, "grad_accum": 1})
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    train(config)
    newest = cfg.checkpoint_dir / "step-00000012"
    expected_sha = model_sha(newest)
    damage(newest / "model.safetensors")

    out = train(config)
    assert "step-00000012 is invalid" in out.stdout and "sha256" in out.stdout, out.stdout[-2000:]
    assert "resumed from" in out.stdout and "step-00000008" in out.stdout
    quarantined = list((cfg.checkpoint_dir / QUARANTINE).glob("step-00000012*"))
    assert len(quarantined) == 1
    assert "model.safetensors" in (quarantined[0] / REASON_FILE).read_text()
    redone = cfg.checkpoint_dir / "step-00000012"
    checkpoint.validate(redone)
    assert model_sha(redone) == expected_sha  # step 12 again, bit for bit


def test_a_corrupted_newest_remote_checkpoint_is_quarantined_and_the_previous_one_fetched(tmp_path, corpus):
    config, remote = remote_of_an_earlier_run(tmp_path, corpus, max_steps=40)
    cfg = load_config(config)
    damage(remote / "step-00000020" / "model.safetensors")

    assert run_supervisor(config, tmp_path, timeout=120, quick=READS_THE_SAME) == 0
    quarantined = list((remote / QUARANTINE).glob("step-00000020*"))
    assert len(quarantined) == 1 and "sha256" in (quarantined[0] / REASON_FILE).read_text()
    assert any("step-00000010" in m for m in event_texts(cfg.run_dir, "fetch"))
    assert "resuming at step 10" in (cfg.run_dir / "logs" / "attempt-0001.log").read_text()
    assert state(cfg.run_dir)["restarts"] == []
    assert checkpoint_dirs.read_latest(remote) == "step-00000040"
    assert fake_weights_of(remote / "step-00000040") == undisturbed_fake_weights(config)


def test_a_checkpoint_fetched_into_empty_scratch_is_shown_as_the_local_one(tmp_path, corpus):
    # its budget past the remote's step 20 (a run done there is no launch: daemon/jobs/rundone.py); the resumed
    # trainer held before its first step, so the fetched checkpoint is still the local one when status is read
    config, remote = remote_of_an_earlier_run(tmp_path, corpus, max_steps=25, steps=("step-00000020",))
    cfg = load_config(config)
    release = tmp_path / "release"
    proc = start_supervisor(config, tmp_path / "supervisor.out", FAKE_HOLD_RESUMED=str(release))
    try:
        wait_for(lambda: (state(cfg.run_dir).get("child") or {}).get("pid"), 120, "the resumed trainer")
        local = state(cfg.run_dir)["local_checkpoint"]
        assert local["step"] == 20 and local["fetched"] is True
        shown = subprocess.run([sys.executable, "-m", "minilmd.cli", "status", str(cfg.run_dir)],
                               capture_output=True, text=True).stdout
        assert "local checkpoint: step 20 (fetched from the remote" in shown, shown
    finally:
        release.touch()
    assert wait_or_kill(proc, 120) == 0
