"""A restart with an empty scratch (a reboot emptied /dev/shm) whose remote checkpoint does not verify when fetched:
through `minilmd run` with the fake trainer (tests/fake_trainer.py), the remote a FUSE mount that misbehaves like an
NFS client with a stale cache (tests/faultfs.py "shrink": the file shows 1,000 bytes).

- a short read of a moment (the stale size gone at the next open of the file) is read again, afresh, after a pause:
  the checkpoint is fetched, never set aside, and the run resumes from its step and ends bit for bit as an
  undisturbed one;
- every checkpoint of a run that synced there reading short at every read: each is set aside (quarantine/, never
  deleted) and the run waits for the remote (staging `waiting_remote`, saying how many were set aside, where, and the
  step state.json records), never trains again from step 0; a checkpoint set back from quarantine/ ends the wait.

On main (fault9 F2) the first short read moved the good checkpoint to quarantine/ and the run started again from
step 0, saying "neither scratch nor <remote> holds a checkpoint".
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs, names
from minilmd.config import load_config
from reliability_helpers import event_texts, fake_weights_of, undisturbed_fake_weights
from supervisor_helpers import (
    READS_THE_SAME,
    cli,
    run_supervisor,
    start_supervisor,
    state,
    synced_steps_10_and_20,
    wait_for,
    wait_or_kill,
    write_config,
)

pytestmark = pytest.mark.slow  # each test runs supervisors through a FUSE mount

MODEL = "*/step-00000020/model.safetensors"


def synced_then_rebooted(tmp_path: Path, corpus, faultfs) -> tuple[Path, object]:
    """A run that trained to step 20 and synced it to a remote on the FUSE mount, its scratch then emptied (a
    reboot); the config that trains it on to 40."""
    remote = {"run": {"remote": str(faultfs.root / "remote")}}
    config = write_config(tmp_path, corpus, remote=False, train={"max_steps": 20}, **remote)
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    config = write_config(tmp_path, corpus, remote=False, train={"max_steps": 40}, **remote)
    cfg = load_config(config)
    assert checkpoint_dirs.read_latest(faultfs.backing / "remote") == "step-00000020"
    assert state(cfg.run_dir)["remote_checkpoint"]["step"] == 20
    shutil.rmtree(cfg.scratch_dir)
    return config, cfg


def synced_10_and_20_then_damaged(tmp_path: Path, corpus, damaged: tuple[str, ...]) -> tuple[Path, object, Path]:
    """A run whose remote holds step 10 and step 20 (sync.keep 2), the model of each step named in `damaged` cut to
    half there (real damage: every read the same), its scratch then emptied (a reboot); the config that trains it on
    to 40, that config loaded, and the remote."""
    config, cfg, remote = synced_steps_10_and_20(tmp_path, corpus, then=40)
    for step in damaged:
        model = remote / step / "model.safetensors"
        model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    shutil.rmtree(cfg.scratch_dir)
    return config, cfg, remote


def waiting_for_the_remote(cfg) -> str:
    """Why staging waits for the remote, once state.json says it does."""
    def waiting():
        staging = state(cfg.run_dir).get("staging") or {}
        return staging.get("state") == "waiting_remote" and staging.get("error")
    return wait_for(waiting, 180, "the run waiting for the remote")


def status_showing(cfg, words: str) -> str:
    """`minilmd status` once it shows `words`: staging retries the fetch, and between two tries it shows
    `staging: fetching` (a CI run read it so, once the pauses between reads were made short)."""
    def shown():
        out = cli("status", str(cfg.run_dir)).stdout
        return out if words in out else ""
    return wait_for(shown, 120, f"status to show {words!r}")


def attempt_logs(cfg) -> list[Path]:
    return sorted((cfg.run_dir / "logs").glob("attempt-*.log"))


def test_a_short_read_of_a_moment_is_read_again_and_the_run_resumes_from_its_step(tmp_path, corpus, faultfs):
    config, cfg = synced_then_rebooted(tmp_path, corpus, faultfs)
    before, said = attempt_logs(cfg), len(event_texts(cfg.run_dir, "fetch"))
    faultfs.shrink(MODEL, 1000, opens=1)  # the first open sees 1,000 bytes; the next one the whole file
    sup = start_supervisor(config, tmp_path / "again.out")
    try:
        assert wait_or_kill(sup, 180) == 0, (tmp_path / "again.out").read_text()[-3000:]
    finally:
        faultfs.clear()
    assert faultfs.hits("shrink"), "the short read never happened"
    remote = faultfs.backing / "remote"
    assert not (remote / names.QUARANTINE).exists(), "a good checkpoint was set aside"
    resumed = [p for p in attempt_logs(cfg) if p not in before]
    assert resumed and "resuming at step 20" in resumed[0].read_text()
    infos = event_texts(cfg.run_dir, "info")
    assert any("step-00000020 does not verify" in m and "read again" in m for m in infos), infos
    assert not any(m.endswith(": starting from step 0") for m in event_texts(cfg.run_dir, "fetch")[said:])
    assert fake_weights_of(remote / "step-00000040") == undisturbed_fake_weights(config)


def test_every_checkpoint_of_a_synced_run_damaged_waits_says_why_and_resumes_once_one_is_set_back(
        tmp_path, corpus, faultfs):
    config, cfg = synced_then_rebooted(tmp_path, corpus, faultfs)
    remote = faultfs.backing / "remote"
    on_remote = sorted(p.name for p in remote.iterdir() if names.is_step_name(p.name))
    assert on_remote
    before, said = attempt_logs(cfg), len(event_texts(cfg.run_dir, "fetch"))
    faultfs.shrink("*model.safetensors", 1000)  # every read of every checkpoint: damaged, as far as it shows
    sup = start_supervisor(config, tmp_path / "again.out", quick=READS_THE_SAME)
    try:
        why = waiting_for_the_remote(cfg)
        assert f"{len(on_remote)} set aside as invalid" in why and "quarantine" in why, why
        assert "state.json records step 20" in why and "synced to it before" in why, why
        status = status_showing(cfg, "waiting_remote")
        assert "set aside as invalid" in status, status
        assert attempt_logs(cfg) == before, "a trainer was started from step 0"
        quarantined = sorted((remote / names.QUARANTINE).iterdir())
        assert [q.name.rsplit("-", 1)[0] for q in quarantined] == on_remote  # set aside, never deleted
        # stopped and started again (a reboot, a unit restart): the remote lists nothing now, and it still waits
        assert cli("stop", str(cfg.run_dir), timeout=120).returncode == 0
        wait_or_kill(sup, 120)
        check = cli("run", "--check", str(config))  # the same rule: no step 0 promised
        assert "waits: run.remote: " in check.stdout and "synced to it before" in check.stdout and \
            "quarantine" in check.stdout and "starts from step 0: " not in check.stdout, check.stdout + check.stderr
        sup = start_supervisor(config, tmp_path / "again.out", quick=READS_THE_SAME)
        why = waiting_for_the_remote(cfg)
        assert "state.json records step 20" in why and "quarantine" in why, why
        assert attempt_logs(cfg) == before, "a trainer was started from step 0"
        # the share answers whole again, and the user sets the newest one back: the wait ends
        faultfs.clear()
        newest = quarantined[-1]
        (newest / "reason.txt").unlink()
        newest.rename(remote / on_remote[-1])
        assert wait_or_kill(sup, 180) == 0, (tmp_path / "again.out").read_text()[-3000:]
    finally:
        faultfs.clear()
        if sup.poll() is None:
            sup.kill()
    fetches = event_texts(cfg.run_dir, "fetch")[said:]
    assert not any(m.endswith(": starting from step 0") for m in fetches), fetches
    resumed = [p for p in attempt_logs(cfg) if p not in before]
    assert resumed and "resuming at step 20" in resumed[0].read_text()
    assert fake_weights_of(remote / "step-00000040") == undisturbed_fake_weights(config)


def test_a_damaged_newest_checkpoint_beside_an_older_good_one_resumes_from_the_older_saying_so(tmp_path, corpus):
    """The damage is real (model.safetensors cut to half on the remote): read again, it reads the same; it is set
    aside and the run resumes from step 10, the older one that verifies, with a note naming the step state.json
    records synced. No wait: the older one is this run's, and nothing would ever mend the newer."""
    config, cfg, remote = synced_10_and_20_then_damaged(tmp_path, corpus, damaged=("step-00000020",))
    assert sorted(p.name for p in remote.iterdir() if names.is_step_name(p.name)) == ["step-00000010",
                                                                                       "step-00000020"]
    before = attempt_logs(cfg)
    assert run_supervisor(config, tmp_path, timeout=180, quick=READS_THE_SAME) == 0, \
        (tmp_path / "supervisor.out").read_text()[-3000:]
    resumed = [p for p in attempt_logs(cfg) if p not in before]
    assert resumed and "resuming at step 10" in resumed[0].read_text()
    notes = event_texts(cfg.run_dir, "note")
    assert any("resuming from the older step 10" in m and "state.json records step 20" in m and
               "steps 11-20 are trained again" in m for m in notes), notes
    assert [q.name.rsplit("-", 1)[0] for q in (remote / names.QUARANTINE).iterdir()] == ["step-00000020"]
    assert fake_weights_of(remote / "step-00000040") == undisturbed_fake_weights(config)


def test_a_remote_that_answers_with_no_checkpoint_that_verifies_is_shown_as_that_not_as_unavailable(tmp_path, corpus):
    """The wait for a valid remote checkpoint in `minilmd status`: sync `none_valid`, saying how many checkpoints the
    remote had and the step state.json records there. Before, `sync: unavailable (remote unavailable: ...)`, though
    the remote answered every read."""
    config, cfg, remote = synced_10_and_20_then_damaged(tmp_path, corpus, damaged=("step-00000010", "step-00000020"))
    before = attempt_logs(cfg)
    sup = start_supervisor(config, tmp_path / "again.out", quick=READS_THE_SAME)
    try:
        why = waiting_for_the_remote(cfg)
        assert "2 set aside as invalid" in why and "state.json records step 20" in why, why
        status = cli("status", str(cfg.run_dir)).stdout
        assert "sync: none_valid (remote answers, no checkpoint there verifies: " in status, status
        assert "2 set aside as invalid" in status and "state.json records step 20" in status, status
        assert "remote unavailable" not in status and "sync: unavailable" not in status, status
        assert attempt_logs(cfg) == before, "a trainer was started"
        assert cli("stop", str(cfg.run_dir), timeout=120).returncode == 0
        assert wait_or_kill(sup, 120) == 0
    finally:
        if sup.poll() is None:
            sup.kill()
