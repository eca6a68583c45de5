"""One trainer per run, with real processes: a `minilmd train` by hand on a config its supervisor is training is
refused before it reads or writes a checkpoint (minilmd/trainer_lock.py), and a trainer whose supervisor was
SIGKILLed stops and saves by itself (minilmd/supervisor_gone.py) instead of training on unsupervised."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from minilmd import checkpoint_dirs, names, trainer_lock
from minilmd.config import load_config
from minilmd.procs import process_alive
from minilmd.scratch import claim
from supervisor_helpers import cli, start_supervisor, state, step_of_state, wait_for, wait_or_kill, write_config

LONG = {"train": {"max_steps": 100000, "checkpoint_every": 5, "micro_batch_size": 2, "grad_accum": 1}}
"""A supervised run that trains until the test stops it."""


def end_run(sup: subprocess.Popen, run_dir) -> None:
    """Whatever a failed test left: `minilmd stop` ends the supervisor, or the trainer it left (its orphan hunt)."""
    cli("stop", str(run_dir), timeout=240)
    if sup.poll() is None:
        sup.kill()
        sup.wait()


def metric_steps(run_dir) -> list[int]:
    steps = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line being appended
            continue
        if record.get("kind", "train") == "train" and isinstance(record.get("step"), int) and "loss" in record:
            steps.append(record["step"])
    return steps


@pytest.mark.slow
def test_a_hand_train_beside_a_supervised_run_is_refused_and_touches_nothing(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False, **LONG)
    cfg = load_config(config)
    sup = start_supervisor(config, tmp_path / "sup.out", fake=False)
    try:
        wait_for(lambda: checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir), 240, "a supervised checkpoint")
        hand = cli("train", str(config), timeout=240, fake=False)
        assert hand.returncode == 69, hand.stdout[-2000:] + hand.stderr[-2000:]
        assert "another trainer already trains this run" in hand.stderr
        assert "launched by the supervisor" in hand.stderr and "minilmd stop" in hand.stderr
        assert "resumed from" not in hand.stdout + hand.stderr
        # the supervised trainer goes on alone: every step logged once, and it is the one that holds the lock
        step = step_of_state(cfg.run_dir)
        wait_for(lambda: step_of_state(cfg.run_dir) > step, 240, "the supervised trainer to go on")
        stop = cli("stop", str(cfg.run_dir), timeout=240)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert wait_or_kill(sup, 240) == 0
    finally:
        end_run(sup, cfg.run_dir)
    steps = metric_steps(cfg.run_dir)
    assert steps and len(steps) == len(set(steps)), "a step logged twice: two trainers wrote the run's metrics"


@pytest.mark.slow
def test_a_trainer_whose_supervisor_is_sigkilled_saves_and_stops(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False, **LONG)
    cfg = load_config(config)
    sup = start_supervisor(config, tmp_path / "sup.out", fake=False)
    try:
        wait_for(lambda: checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir), 240, "a supervised checkpoint")
        record = json.loads((cfg.run_dir / names.TRAINER_RECORD).read_text())
        trainer, ticks = record["pid"], record["start_ticks"]
        assert process_alive(trainer, ticks)
        sup.send_signal(signal.SIGKILL)
        sup.wait(60)
        wait_for(lambda: not process_alive(trainer, ticks), 240, "the orphaned trainer to stop by itself")
    finally:
        end_run(sup, cfg.run_dir)
    log = (cfg.run_dir / "logs" / names.attempt_log_name(state(cfg.run_dir).get("attempt") or 1)).read_text()
    assert f"its supervisor (pid {sup.pid}) has ended" in log
    saved_at = int(log.rsplit("; saving at step ", 1)[1].split()[0])
    newest = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    assert newest.name == names.step_name(saved_at)


def hold_in_child(scratch, run_dir, supervised: bool) -> subprocess.Popen:
    """A process that holds the trainer lock until its stdin closes; returns once it holds it."""
    code = ("import sys; from pathlib import Path; from minilmd import trainer_lock; "
            f"trainer_lock.hold(Path({str(scratch)!r}), Path({str(run_dir)!r}), {supervised}); "
            "print('held', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


@pytest.mark.parametrize("supervised", [True, False])
def test_a_second_holder_is_refused_naming_the_first(tmp_path, supervised):
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    first = hold_in_child(scratch, tmp_path / "run", supervised)
    try:
        with pytest.raises(trainer_lock.TrainerLockRefused) as refused:
            trainer_lock.hold(scratch, tmp_path / "run", supervised=False)
        said = str(refused.value)
        assert f"pid {first.pid}" in said
        assert ("launched by the supervisor" in said) == supervised
        assert ("no supervisor" in said) != supervised
    finally:
        first.stdin.close()
        first.wait(60)


@pytest.mark.parametrize("supervised, same_run, retried", [(True, True, True), (True, False, False),
                                                            (False, True, False)])
def test_only_this_runs_supervised_holder_is_retried(tmp_path, supervised, same_run, retried):
    """A held lock is retried (exit 69) only when its holder is this run's supervised trainer; a `minilmd train` by
    hand holding it (or another run's trainer) is exit 2 for good, or the supervisor would sync and prune that
    trainer's checkpoints as its own while it retried (review10e F1)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    first = hold_in_child(scratch, tmp_path / ("run" if same_run else "other"), supervised)
    try:
        with pytest.raises(trainer_lock.TrainerLockHeld) as refused:
            trainer_lock.hold(scratch, tmp_path / "run", supervised=True)
        assert refused.value.retried is retried
    finally:
        first.stdin.close()
        first.wait(60)


def test_the_lock_is_free_again_once_its_holder_ends(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    first = hold_in_child(scratch, tmp_path / "run", True)
    first.stdin.close()
    first.wait(60)
    check = subprocess.run([sys.executable, "-c", "from pathlib import Path; from minilmd import trainer_lock; "
                            f"trainer_lock.hold(Path({str(scratch)!r}), Path('/r'), False)"], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stderr


def test_a_link_in_the_locks_place_is_not_followed(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    os.symlink(victim, scratch / names.TRAINER_LOCK)
    with pytest.raises(trainer_lock.TrainerLockRefused, match="cannot be opened as the trainer lock"):
        trainer_lock.hold(scratch, tmp_path / "run", supervised=False)
    assert victim.read_text() == "mine\n"


def test_a_trainer_refused_by_a_held_lock_exits_69_and_the_supervisor_retries_it(tmp_path, corpus):
    """The last attempt's rank 0, SIGKILLed but still dying, holds the lock when the next attempt starts (review10d
    F1): its refusal is exit 69, which the supervisor retries with backoff, not exit 2, a config error for good."""
    from minilmd import protocol
    from minilmd.daemon.base.states import Action, Cause
    from minilmd.daemon.child.death import classify
    from minilmd.daemon.child.policy import decide
    from minilmd.daemon.child.process import launch

    config = write_config(tmp_path, corpus, remote=False)
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)  # the run's own, as the launch made it
    holder = hold_in_child(cfg.scratch_dir, cfg.run_dir, supervised=True)
    try:
        child = launch([sys.executable, "-m", "minilmd.cli", "train", str(config)], cfg.run_dir, 2, devices="")
        death = classify(child, child.popen.wait(240), cfg.run_dir, stop_requested=False)
    finally:
        holder.stdin.close()
        holder.wait(60)
    assert death.exit == protocol.EXIT_TRAINER_BUSY, child.log_path.read_text()[-2000:]
    assert death.cause == Cause.CRASH and "another trainer already trains this run" in death.detail
    decision = decide(death, restart=cfg.restart, restarts_so_far=0, no_progress_streak=1, stop_requested=False,
                      micro_batch_size=2, grad_accum=1)
    assert decision.action == Action.RESTART, decision


def test_a_hand_train_refused_by_a_held_lock_says_who_holds_it(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False)
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    claim(cfg.scratch_dir, cfg.run_dir, cfg.run.name, cfg.scratch_is_default)  # the first hand trainer's claim
    holder = hold_in_child(cfg.scratch_dir, cfg.run_dir, supervised=False)
    try:
        hand = cli("train", str(config), timeout=240, fake=False)
    finally:
        holder.stdin.close()
        holder.wait(60)
    assert hand.returncode == 2, hand.stdout[-2000:] + hand.stderr[-2000:]  # a hand holder: not retried
    assert f"another trainer already trains this run: pid {holder.pid}" in hand.stderr
