"""A restart whose scratch holds no checkpoint (a reboot emptied /dev/shm) and whose remote is out of reach (its
share not mounted yet: not there, an empty mount point, a link to nowhere) waits for the remote when the run has
synced before, and resumes from the remote's step once it is back; a run that never synced, or `run --fresh`,
starts from step 0 (daemon/jobs/remotewait.py). Through `minilmd run` with the fake trainer (tests/fake_trainer.py).

On main such a restart printed "neither scratch nor <remote> holds a checkpoint: starting from step 0" and trained
again from step 0; `run --check` said nothing of it.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs, names
from minilmd.config import load_config
from reliability_helpers import event_texts, fake_weights_of, undisturbed_fake_weights
from supervisor_helpers import (
    cli,
    env_for,
    run_supervisor,
    start_supervisor,
    state,
    wait_for,
    wait_or_kill,
    write_config,
)

pytestmark = pytest.mark.slow  # each test runs supervisors to the end

OUT_OF_REACH = ["not there", "an empty mount point", "a link to nowhere"]


def synced_run(tmp_path: Path, corpus) -> tuple[Path, object]:
    """A run that trained to step 20 and synced it, then a config that trains it on to 40."""
    config = write_config(tmp_path, corpus, train={"max_steps": 20})
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    config = write_config(tmp_path, corpus, train={"max_steps": 40})
    cfg = load_config(config)
    assert (Path(cfg.run.remote) / "step-00000020").is_dir()
    return config, cfg


def take_away(remote: Path, how: str, tmp_path: Path) -> Path:
    """The remote out of reach as a share not mounted shows it; where its checkpoints are meanwhile."""
    away = tmp_path / "share" / "remote"
    away.parent.mkdir(exist_ok=True)
    remote.rename(away)
    if how == "an empty mount point":
        remote.mkdir()
    elif how == "a link to nowhere":
        remote.symlink_to(tmp_path / "nfs" / "remote")
    return away


def bring_back(remote: Path, away: Path, how: str, tmp_path: Path) -> None:
    if how == "a link to nowhere":  # the share mounted where the link leads
        (tmp_path / "nfs").mkdir()
        away.rename(tmp_path / "nfs" / "remote")
        return
    if how == "an empty mount point":
        remote.rmdir()
    away.rename(remote)


def gone(pid: int) -> bool:
    """The process is dead (gone, or a zombie its new parent has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def check_output(config: Path, *flags: str) -> str:
    out = cli("run", "--check", str(config), *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("how", OUT_OF_REACH)
def test_a_restart_with_empty_scratch_waits_for_a_remote_out_of_reach_then_resumes_from_its_step(
        tmp_path, corpus, how):
    config, cfg = synced_run(tmp_path, corpus)
    shutil.rmtree(cfg.scratch_dir)  # the reboot emptied /dev/shm
    remote = Path(cfg.run.remote)
    away = take_away(remote, how, tmp_path)
    said = check_output(config)
    assert "waits: run.remote:" in said and "this run has synced to it before (state.json records step 20" in said, \
        said
    assert "`minilmd run --fresh` starts from step 0 instead" in said, said

    sup = start_supervisor(config, tmp_path / "restart.out")
    try:
        wait_for(lambda: len([m for m in event_texts(cfg.run_dir, "fetch") if "remote unavailable" in m]) >= 3, 60,
                 "three fetch tries waiting for the remote")
        assert sup.poll() is None, (tmp_path / "restart.out").read_text()[-3000:]
        # each fetch try shows "fetching" for a moment (the backoff here is 0.1-0.5 s): the wait between tries
        status = wait_for(lambda: next((out for out in [cli("status", str(cfg.run_dir)).stdout]
                                        if "staging: waiting_remote" in out), None), 60, "status: waiting_remote")
        assert "synced to it before" in status, status
        assert not (cfg.run_dir / "logs" / "attempt-0002.log").exists(), "a trainer started from step 0"
        bring_back(remote, away, how, tmp_path)
        assert wait_or_kill(sup) == 0, (tmp_path / "restart.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
    started_over = [m for m in event_texts(cfg.run_dir, "fetch") if m.endswith(": starting from step 0")]
    assert len(started_over) == 1 and "never synced" in started_over[0], started_over  # the first run's, not this
    assert "resuming at step 20" in (cfg.run_dir / "logs" / "attempt-0002.log").read_text()
    assert fake_weights_of(remote / "step-00000040") == undisturbed_fake_weights(config)


def test_a_run_that_never_synced_starts_from_step_0_with_its_remote_not_there(tmp_path, corpus):
    """A new run's remote is not made yet: said so, not "its share gone?" (on main: `is not there (its share
    gone?)`, at `--check` and in the first start's log); a remote below an empty directory the user made is no
    unmounted share's stub (one fstab or autofs names is refused: tests/test_remote_parents.py)."""
    config = write_config(tmp_path, corpus, train={"max_steps": 20})
    cfg = load_config(config)
    said = check_output(config)
    assert f"starts from step 0: run.remote: {cfg.run.remote} does not exist yet (the first sync creates it), and " \
           f"this run has never synced to it" in said and "share gone" not in said, said
    mine = tmp_path / "mnt" / "nfs"
    mine.mkdir(parents=True)  # an empty directory the user made, no fstab or autofs mount point: not a share's stub
    checked = cli("run", "--check", str(config), "--set", f'run.remote="{mine / "runs" / "s"}"')
    said = checked.stdout + checked.stderr  # a first launch starts, its first sync makes the chain (review10c 2)
    assert checked.returncode == 0 and "starts from step 0" in said and "not a mount point" not in said, said
    assert f"does not exist yet (the first sync creates it and the directories missing above it in {mine}, an " \
           f"empty directory that no fstab" in said and "share gone" not in said, said  # what the sync will do
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    assert any("does not exist yet (the first sync creates it), and this run has never synced to it: starting from "
               "step 0" in m for m in event_texts(cfg.run_dir, "fetch")), event_texts(cfg.run_dir, "fetch")
    assert fake_weights_of(Path(cfg.run.remote) / "step-00000020") == undisturbed_fake_weights(config)


def test_fresh_starts_from_step_0_though_the_run_synced_before(tmp_path, corpus):
    config, cfg = synced_run(tmp_path, corpus)
    shutil.rmtree(cfg.scratch_dir)
    take_away(Path(cfg.run.remote), "not there", tmp_path)
    said = check_output(config, "--fresh")
    assert "starts from step 0: run.remote:" in said and "and `--fresh` was given (state.json records step 20" in \
        said, said
    out = subprocess.run([sys.executable, "-m", "minilmd.cli", "run", "--fresh", str(config)], capture_output=True,
                         text=True, timeout=120, env=env_for())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    fetch = event_texts(cfg.run_dir, "fetch")
    assert any("`--fresh` was given" in m and "starting from step 0" in m for m in fetch), fetch
    assert "resuming at step 0" in (cfg.run_dir / "logs" / "attempt-0002.log").read_text()
    assert fake_weights_of(Path(cfg.run.remote) / "step-00000040") == undisturbed_fake_weights(config)


def test_a_remote_that_is_a_link_to_nowhere_is_said_so_and_the_last_sync_try_promises_no_retry(tmp_path, corpus):
    """A run that never synced starts from step 0; its syncs fail, saying what the remote is (on main:
    `FileExistsError: [Errno 17] File exists`), and the last of the three final tries says there is no retry (on
    main: "retry in 10s" there too)."""
    config = write_config(tmp_path, corpus, train={"max_steps": 10})
    cfg = load_config(config)
    Path(cfg.run.remote).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.run.remote).symlink_to(tmp_path / "nfs" / "remote")
    assert run_supervisor(config, tmp_path) == 1, (tmp_path / "supervisor.out").read_text()[-3000:]
    failed = [m for m in event_texts(cfg.run_dir, "sync") if m.startswith("sync failed")]
    assert failed and all("a link to nowhere (-> " in m and "File exists" not in m for m in failed), failed
    assert "that was the last of 3 tries: no retry" in failed[-1] and "retry in" not in failed[-1], failed
    assert "(try 2/3)" in failed[-2], failed


def test_a_killed_run_rebooted_before_its_share_is_mounted_waits_then_resumes_where_the_remote_is(tmp_path, corpus):
    """The issue's way: supervisor and trainer SIGKILLed mid-run, scratch emptied, the remote an unmounted mount
    point at the restart."""
    config = write_config(tmp_path, corpus, train={"max_steps": 60, "checkpoint_every": 5})
    cfg = load_config(config)
    first = start_supervisor(config, tmp_path / "first.out", FAKE_STEP_S="0.05")
    try:
        wait_for(lambda: ((state(cfg.run_dir).get("remote_checkpoint") or {}).get("step") or 0) >= 10, 60,
                 "a sync of step 10 or later")
        trainer = state(cfg.run_dir)["child"]["pid"]
        first.send_signal(signal.SIGKILL)
        first.wait()
        os.killpg(trainer, signal.SIGKILL)  # the trainer leads its own process group
    finally:
        if first.poll() is None:
            first.kill()
    wait_for(lambda: gone(trainer), 30, "the trainer gone")
    remote = Path(cfg.run.remote)
    synced = checkpoint_dirs.list_checkpoints(remote)[-1]
    shutil.rmtree(cfg.scratch_dir)
    away = take_away(remote, "an empty mount point", tmp_path)
    sup = start_supervisor(config, tmp_path / "restart.out")
    try:
        wait_for(lambda: len([m for m in event_texts(cfg.run_dir, "fetch") if "remote unavailable" in m]) >= 3, 60,
                 "three fetch tries waiting for the remote")
        assert sup.poll() is None and not list((cfg.run_dir / "logs").glob("attempt-0002.log"))
        bring_back(remote, away, "an empty mount point", tmp_path)
        assert wait_or_kill(sup) == 0, (tmp_path / "restart.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
    assert f"resuming at step {names.step_of(synced.name)}" in (cfg.run_dir / "logs" / "attempt-0002.log").read_text()
    assert fake_weights_of(remote / "step-00000060") == undisturbed_fake_weights(config)


def synced_step(run_dir: Path) -> int:
    return (state(run_dir).get("remote_checkpoint") or {}).get("step") or 0


def test_fresh_does_not_outlive_the_first_staging(tmp_path, corpus):
    """`run --fresh` holds for the supervisor's first staging only: a run started with it that has synced since,
    whose scratch then loses its checkpoints while the remote is out of reach, waits and resumes from the step it
    synced itself (on main: the re-staging started again from step 0 and erased state.json's remote checkpoint,
    the lineage this very run had synced)."""
    config = write_config(tmp_path, corpus, train={"max_steps": 60, "checkpoint_every": 5})
    cfg = load_config(config)
    log = open(tmp_path / "fresh.out", "ab")
    sup = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "run", "--fresh", str(config)], stdout=log,
                           stderr=subprocess.STDOUT, env=env_for(FAKE_STEP_S="0.05"))
    try:
        wait_for(lambda: synced_step(cfg.run_dir) >= 10 and state(cfg.run_dir)["sync"]["state"] != "syncing", 60,
                 "a sync of step 10 or later, not syncing")
        trainer = state(cfg.run_dir)["child"]["pid"]
        os.killpg(trainer, signal.SIGSTOP)  # no save while scratch is emptied
        remote = Path(cfg.run.remote)
        synced = checkpoint_dirs.list_checkpoints(remote)[-1]
        away = take_away(remote, "not there", tmp_path)
        shutil.rmtree(cfg.checkpoint_dir)  # a cleaner emptied scratch's checkpoints
        os.killpg(trainer, signal.SIGKILL)
        os.killpg(trainer, signal.SIGCONT)
        wait_for(lambda: len([m for m in event_texts(cfg.run_dir, "fetch") if "remote unavailable" in m]) >= 2, 60,
                 "two fetch tries waiting for the remote")
        status = wait_for(lambda: next((out for out in [cli("status", str(cfg.run_dir)).stdout]
                                        if "staging: waiting_remote" in out), None), 60, "status: waiting_remote")
        assert "synced to it before (state.json records step" in status, status
        assert "local checkpoint: none" in status, status  # metrics.jsonl's saves are gone from scratch
        assert synced_step(cfg.run_dir) == names.step_of(synced.name), state(cfg.run_dir).get("remote_checkpoint")
        bring_back(remote, away, "not there", tmp_path)
        assert wait_or_kill(sup) == 0, (tmp_path / "fresh.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    started_over = [m for m in event_texts(cfg.run_dir, "fetch") if m.endswith(": starting from step 0")]
    assert len(started_over) == 1, started_over  # the first staging's, with --fresh
    attempts = sorted((cfg.run_dir / names.ATTEMPT_LOGS).glob("attempt-*.log"))
    assert f"resuming at step {names.step_of(synced.name)}" in attempts[-1].read_text()
    assert fake_weights_of(remote / "step-00000060") == undisturbed_fake_weights(config)


def test_a_restart_whose_records_cannot_be_read_waits_and_so_does_the_one_after(tmp_path, corpus):
    """state.json torn and events.jsonl rotated away: whether the run synced is unknown, so it waits, saying why
    (on main: "never synced", step 0); the state.json that supervisor writes holds no remote step, and the next
    restart still waits (its events.jsonl says an earlier start could not read state.json)."""
    config, cfg = synced_run(tmp_path, corpus)
    shutil.rmtree(cfg.scratch_dir)
    (cfg.run_dir / names.STATE).write_text('{"remote_checkpoint": {"step": 20, "pa')
    (cfg.run_dir / names.EVENTS).unlink()
    remote = Path(cfg.run.remote)
    away = take_away(remote, "not there", tmp_path)
    for start in ("first", "second"):
        sup = start_supervisor(config, tmp_path / f"{start}.out")
        try:
            tries = len([m for m in event_texts(cfg.run_dir, "fetch") if "remote unavailable" in m])
            wait_for(lambda: len([m for m in event_texts(cfg.run_dir, "fetch") if "remote unavailable" in m]) >=
                     tries + 2, 60, f"two fetch tries of the {start} restart waiting for the remote")
            said = [m for m in event_texts(cfg.run_dir, "fetch") if "remote unavailable" in m][-1]
            assert "this run's records cannot be read (state.json " in said, said
            if start == "second":
                assert "at an earlier start): it may have synced to it before" in said, said
                bring_back(remote, away, "not there", tmp_path)
                assert wait_or_kill(sup) == 0, (tmp_path / "second.out").read_text()[-3000:]
            else:
                sup.send_signal(signal.SIGTERM)
                assert wait_or_kill(sup) == 0, (tmp_path / "first.out").read_text()[-3000:]
        finally:
            if sup.poll() is None:
                sup.kill()
                sup.wait()
    assert not [m for m in event_texts(cfg.run_dir, "fetch") if m.endswith(": starting from step 0")]
    attempts = sorted((cfg.run_dir / names.ATTEMPT_LOGS).glob("attempt-*.log"))
    assert "resuming at step 20" in attempts[-1].read_text()
    assert fake_weights_of(remote / "step-00000040") == undisturbed_fake_weights(config)


def test_a_run_pointed_at_a_new_empty_remote_does_not_wait_for_the_old_ones_step(tmp_path, corpus):
    """The records count only when they name the current run.remote: a run moved to a new (empty) place with
    `--fresh` starts from step 0 there (on main: it waited forever, "synced to it before (state.json records step 20
    ...)"). Without `--fresh` such a start is refused (tests/test_run_identity.py): its run.dir holds the old
    remote's timeline."""
    config, cfg = synced_run(tmp_path, corpus)
    shutil.rmtree(cfg.scratch_dir)
    new = tmp_path / "new-share" / "remote"
    new.mkdir(parents=True)
    config = write_config(tmp_path, corpus, train={"max_steps": 40}, run={"remote": str(new)})
    sup = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "run", "--fresh", str(config)],
                           stdout=open(tmp_path / "moved.out", "ab"), stderr=subprocess.STDOUT, env=env_for())
    try:
        wait_for(lambda: any(m.endswith(": starting from step 0") and str(new) in m
                             for m in event_texts(cfg.run_dir, "fetch")), 60, "a start from step 0 on the new remote")
        assert wait_or_kill(sup) == 0, (tmp_path / "moved.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    said = [m for m in event_texts(cfg.run_dir, "fetch") if str(new) in m]
    # an empty directory no mount table names, made by the user: the first sync writes in it, no share's stub
    assert "is an empty directory that no fstab" in said[0] and "this run has never synced to it" in said[0] and \
        "synced to it before" not in said[0], said
    assert fake_weights_of(new / "step-00000040") == undisturbed_fake_weights(config)
