"""A DPO run's reference pass that outlasts the supervisor's limits (found by a new user: the demo's pairs doubled,
restart.hang_timeout 30s): the pass wrote no heartbeat, so the supervisor killed it as hung after its start-up
grace, every restart computed it again from zero, and the run gave up (exit 79) before its first step. Each batch of
the pass now refreshes the heartbeat, and a long pass prints its progress. Found by a reviewer: status said nothing of
the pass and a stop waited for its end; its heartbeat now says how far it is, and a stop ends it between batches."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from in_process import train_in_process
from minilmd.config import load_config
from minilmd.daemon.base.runstate import Heartbeat, RunState, read_heartbeat
from minilmd.daemon.base.statesections import ChildInfo, StateJson
from minilmd.daemon.child.trainerwatch import STARTUP_GRACE_S
from minilmd.daemon.views.status import summary_lines
from minilmd.names import ATTEMPT_LOGS, DPO_REFERENCE, MANIFEST, REFERENCE_PASS, STATE, TRAINER_CMD_ENV
from minilmd.protocol import EXIT_DONE, EXIT_STOPPED
from minilmd.trainer.loop.dpo_reference import PassProgress
from supervisor_helpers import cli, events, run_supervisor, start_supervisor, state, wait_for, write_config
from trainer_corpus import child_env, read_metrics, run_paths

SLOW_REFERENCE_TRAINER = Path(__file__).with_name("slow_reference_trainer.py")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_reference_pass_prints_its_progress_only_when_it_is_long(capsys):
    clock = Clock()
    progress = PassProgress(2446, printing=True, clock=clock)
    for _ in range(30):  # 240 pairs in 3 s: short, nothing said
        clock.now += 0.1
        progress.advance(8)
    assert capsys.readouterr().out == ""
    clock.now += 9.0  # 12 s in, a tenth more than at the start
    progress.advance(8)
    assert capsys.readouterr().out == "minilmd: DPO reference pass: 248/2,446 pairs, 12 s\n"
    clock.now += 20.0  # 20 s later, only 8 pairs more: not yet a tenth
    progress.advance(8)
    assert capsys.readouterr().out == ""
    clock.now += PassProgress.PROGRESS_MAX_S  # however slow, never silent for longer than this
    progress.advance(8)
    assert capsys.readouterr().out.startswith("minilmd: DPO reference pass: 264/2,446 pairs")
    clock.now += 60.0
    progress.advance(2446 - 264)  # the end: the caller's own line says it
    assert capsys.readouterr().out == "" and progress.elapsed() == pytest.approx(clock.now - 100.0)
    quiet = PassProgress(10, printing=False, clock=clock)  # a rank other than 0
    clock.now += 1000
    quiet.advance(5)
    assert capsys.readouterr().out == ""


STARTUP_GRACE_S_HERE, PASS_BATCH_S = 30.0, 0.25
"""The supervisor's start-up grace in the test below (STARTUP_GRACE_S, 60 s, halved through tests/quick_cli.py:
still ten times a trainer's start here before its first heartbeat), and the slowed pass's sleep a batch: its 154 pairs
last 38.5 s at the least, 1.28 times that grace, as dpo_corpus's 761 at 0.1 s were 1.27 times STARTUP_GRACE_S."""


@pytest.mark.slow  # a reference pass made to last past the supervisor's start-up grace (30 s here), then 4 steps
def test_a_reference_pass_longer_than_the_hang_timeout_is_not_taken_for_a_hang(tmp_path, small_dpo_corpus):
    config = write_config(tmp_path, small_dpo_corpus, name="slowref", data={"val_windows": 8},
                          train={"seq_len": 128, "micro_batch_size": 1, "max_steps": 4, "checkpoint_every": 2},
                          restart={"hang_timeout": "5s", "no_progress_limit": 1, "max_restarts": 1})
    assert STARTUP_GRACE_S_HERE < STARTUP_GRACE_S  # the grace in use is not the one the test outlasts
    slow = {TRAINER_CMD_ENV: f"{sys.executable} {SLOW_REFERENCE_TRAINER}", "SLOW_REFERENCE_BATCH_S": str(PASS_BATCH_S)}
    assert run_supervisor(config, tmp_path, timeout=600, fake=False,
                          quick={"TEST_STARTUP_GRACE_S": str(STARTUP_GRACE_S_HERE)}, **slow) == EXIT_DONE, \
        (tmp_path / "supervisor.out").read_text()
    run_dir = load_config(config).run_dir
    assert not [e for e in events(run_dir) if e["event"] == "hang"]
    made = read_metrics(run_dir, "dpo_reference")
    assert len(made) == 1 and made[0]["source"] == "computed"
    assert made[0]["seconds"] > STARTUP_GRACE_S_HERE  # outlasted every limit the supervisor has before a first step
    log = (run_dir / ATTEMPT_LOGS / "attempt-0001.log").read_text()
    assert "minilmd: DPO reference pass: " in log and " pairs, " in log


def _reference_beat(run_dir: Path, proc: subprocess.Popen) -> Heartbeat:
    """The trainer's first heartbeat that says its reference pass has done some pairs (it sleeps per batch)."""
    while proc.poll() is None:
        beat = read_heartbeat(run_dir)
        if beat is not None and beat.reference_pass() is not None and beat.reference_pass()[0] > 0:
            return beat
        time.sleep(0.2)
    raise AssertionError(f"the trainer ended (exit {proc.returncode}) before its heartbeat named the pass")


def _stopped_in_pass(config: Path, show_status: bool = False) -> int:
    """Run the (slowed) trainer in a process of its own, SIGTERM it once its heartbeat says its reference pass has
    done some pairs (with show_status, what status shows of it then is checked first); it exits 75 saying how many
    pairs it kept, which is returned."""
    run_dir = run_paths(config)[0]
    cmd = [sys.executable, str(SLOW_REFERENCE_TRAINER), "train", str(config)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env()) as proc:
        try:
            beat = _reference_beat(run_dir, proc)
            done, total, began, _ = beat.reference_pass()  # and this attempt's start and seconds: its rate
            assert 0 == began < done < total
            if show_status:
                running = StateJson(child=ChildInfo(pid=proc.pid, attempt=1, started=1.0)).to_dict()
                held = RunState(run_dir / STATE, running)  # the supervisor's fold of its trainer's heartbeat
                held.apply_progress([], beat)
                shown = summary_lines(StateJson.from_dict(held.to_dict()), alive=True)
                assert f"  step 0/2 (0.0%)  DPO reference pass {done:,}/{total:,} pairs" in "\n".join(shown), shown
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == EXIT_STOPPED, out
    said = re.search(r"SIGTERM received during the DPO reference pass \(([\d,]+)/([\d,]+) pairs\); the pairs done "
                     r"are saved at step 0", out)
    assert said, out
    kept = int(said[1].replace(",", ""))
    assert 0 < kept < int(said[2].replace(",", "")), out  # left in the middle
    return kept


@pytest.mark.slow  # a trainer in a real process, stopped by a real SIGTERM in its (slowed) reference pass
def test_a_stop_during_the_reference_pass_keeps_it_and_the_resumed_run_ends_bit_identical(tmp_path, dpo_corpus):
    """Found by a reviewer: during a 208 s reference pass `minilmd status` said only "training ... step 0", and
    `minilmd stop` took 86 s; its heartbeat now says how far it is, as status shows it, and a stop is acted on between
    two of its batches. Found by a new user: that stop threw the pass away (exit 75, nothing saved, scratch removed:
    "the run stopped before its first checkpoint"), and the next start computed it all again (104 s on 2,431 pairs,
    hours on a real corpus: a Slurm requeue loop never gets past it). The stop now saves step 0 with the sums done
    and how far the pass got; the next start goes on from there, and the run ends with the weights, optimizer state
    and reference of an undisturbed run, byte for byte."""
    values = dict(data={"val_windows": 8},
                  train={"seq_len": 128, "micro_batch_size": 1, "max_steps": 2, "checkpoint_every": 2})
    config = write_config(tmp_path, dpo_corpus, name="stopref", **values)
    run_dir, ckpt_dir = run_paths(config)
    kept = _stopped_in_pass(config, show_status=True)
    assert not read_metrics(run_dir, "dpo_reference") and [p.name for p in ckpt_dir.glob("step-*")] == \
        ["step-00000000"]
    again = train_in_process(config)  # the real trainer, here: the pass goes on from the kept pairs, then trains
    assert again.returncode == EXIT_DONE, again.stderr
    made = read_metrics(run_dir, "dpo_reference")
    assert [(m["source"], m.get("resumed_at")) for m in made] == [("computed", kept)], made
    assert f"going on from the {kept:,} pairs a stopped pass kept" in again.stdout, again.stdout
    assert read_heartbeat(run_dir).reference_pass() is None  # training's heartbeats name no pass
    straight = write_config(tmp_path, dpo_corpus, name="straight", **values)
    assert train_in_process(straight).returncode == EXIT_DONE
    straight_ckpt = run_paths(straight)[1]
    for step in ("step-00000000", "step-00000002"):
        for name in ("model.safetensors", "optimizer.safetensors", DPO_REFERENCE):
            assert (ckpt_dir / step / name).read_bytes() == (straight_ckpt / step / name).read_bytes(), (step, name)


@pytest.mark.slow  # a trainer stopped by a real SIGTERM in its (slowed) reference pass, then two runs
def test_a_kept_pass_at_another_micro_batch_size_is_computed_again_from_the_start(tmp_path, dpo_corpus):
    """The kept sums are those of the pass's batches of micro_batch_size pairs (padded to each batch's width class):
    a resume at another micro_batch_size would mix two roundings, so it computes the pass again from the start,
    saying so, and its reference is an undisturbed run's at the new size, byte for byte."""
    values = dict(data={"val_windows": 8},
                  train={"seq_len": 128, "micro_batch_size": 1, "max_steps": 1, "checkpoint_every": 1})
    config = write_config(tmp_path, dpo_corpus, name="mb", **values)
    kept = _stopped_in_pass(config)
    again = train_in_process(config, "train.micro_batch_size=2")
    assert again.returncode == EXIT_DONE, again.stderr
    assert (f"the stopped DPO reference pass kept {kept:,} pairs computed at train.micro_batch_size = 1, now 2: "
            "computed again from the start") in again.stdout, again.stdout
    made = read_metrics(run_paths(config)[0], "dpo_reference")
    assert [(m["source"], m.get("resumed_at")) for m in made] == [("computed", None)], made
    straight = write_config(tmp_path, dpo_corpus, name="mb2", **{**values, "train": {**values["train"],
                                                                                  "micro_batch_size": 2}})
    assert train_in_process(straight).returncode == EXIT_DONE
    name = f"step-00000000/{DPO_REFERENCE}"
    assert (run_paths(config)[1] / name).read_bytes() == (run_paths(straight)[1] / name).read_bytes()


@pytest.mark.slow  # a supervisor and its real trainer, whose reference pass is slowed, stopped by `minilmd stop`
def test_minilmd_status_and_stop_during_the_reference_pass_under_the_supervisor(tmp_path, dpo_corpus):
    """What the operator sees and does: `minilmd status` names the pass and how far it is, `minilmd stop` ends it
    between two batches and the supervisor ends stopped, the pass so far saved at step 0 and synced to the remote
    (before: nothing saved, scratch removed, "the run stopped before its first checkpoint"); the next `minilmd run`
    goes on from there."""
    config = write_config(tmp_path, dpo_corpus, name="opstop", data={"val_windows": 8},
                          train={"seq_len": 128, "micro_batch_size": 1, "max_steps": 2, "checkpoint_every": 2})
    run_dir, ckpt_dir = run_paths(config)
    shown: list[str] = []
    _stopped_under_supervisor(config, tmp_path, beyond=0,
                              while_in_pass=lambda: shown.append(cli("status", str(run_dir)).stdout))
    assert re.search(r"  step 0/2 \(0.0%\)  DPO reference pass [\d,]+/[\d,]+ pairs", shown[0]), shown
    log = (run_dir / ATTEMPT_LOGS / "attempt-0001.log").read_text()
    assert "SIGTERM received during the DPO reference pass" in log and "saved at step 0" in log, log
    assert not read_metrics(run_dir, "dpo_reference") and [p.name for p in ckpt_dir.glob("step-*")] == \
        ["step-00000000"]
    remote = Path(load_config(config).run.remote)
    assert (remote / "step-00000000" / DPO_REFERENCE).read_bytes() == \
        (ckpt_dir / "step-00000000" / DPO_REFERENCE).read_bytes()
    assert "before its first checkpoint" not in (tmp_path / "supervisor.out").read_text()
    kept = json.loads((ckpt_dir / "step-00000000" / MANIFEST).read_text())[REFERENCE_PASS]
    stopped = cli("status", str(run_dir)).stdout  # before: "step 0" alone, as if nothing of the pass was kept
    assert f"  step 0/2 (0.0%) (DPO reference pass {kept[0]:,}/{kept[1]:,} pairs saved)" in stopped, stopped
    assert run_supervisor(config, tmp_path, timeout=600, fake=False) == EXIT_DONE, \
        (tmp_path / "supervisor.out").read_text()
    made = read_metrics(run_dir, "dpo_reference")
    assert [m["source"] for m in made] == ["computed"] and made[0]["resumed_at"] > 0, made


def _kept_pairs(step_dir: Path) -> int:
    """How far the stopped pass a step 0 holds got (its reference file's `pass` tensor: pairs done)."""
    from safetensors.numpy import load

    return int(load((step_dir / DPO_REFERENCE).read_bytes())["pass"][0])


def _stopped_under_supervisor(config: Path, tmp_path: Path, beyond: int,
                              while_in_pass: Callable[[], object] = lambda: None) -> None:
    """A supervisor and its (slowed) real trainer on a new machine, stopped by `minilmd stop` once its reference
    pass is past `beyond` pairs (on from a stopped pass it staged from the remote: past what that kept), after
    `while_in_pass()` (a look at the run while the supervisor's state names the pass)."""
    run_dir = run_paths(config)[0]
    slow = f"{sys.executable} {SLOW_REFERENCE_TRAINER}"
    sup = start_supervisor(config, tmp_path / "supervisor.out", fake=False, **{TRAINER_CMD_ENV: slow})
    try:
        past = lambda: ((state(run_dir).get("progress") or {}).get("reference_pass") or [0])[0] > beyond
        wait_for(lambda: sup.poll() is not None or past(), 300, f"the reference pass to pass {beyond} pairs")
        assert past(), (tmp_path / "supervisor.out").read_text()  # not ended first, the pass never named
        while_in_pass()
        stopped = cli("stop", str(run_dir), timeout=300)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert sup.wait(120) == 0, (tmp_path / "supervisor.out").read_text()
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


@pytest.mark.slow  # three supervised starts of a run, two of them stopped in a (slowed) reference pass, and a fourth
def test_a_pass_stopped_twice_each_time_on_a_new_machine_reaches_the_remote_and_finishes_bit_identical(
        tmp_path, dpo_corpus):
    """Found by a reviewer: the remote kept the first step 0 it was given (a sync does not copy a step the remote
    holds), so a second stop of the pass saved its further progress in scratch only; a start on another machine
    (a Slurm requeue onto another node, a reboot: /dev/shm empty) staged the first stop's and computed again all
    that was done since, and a job preempted on a new node each time never got past it. The sync now puts a further
    pass's step 0 in place of the remote's, whole, and the complete one in the end; nothing else there is touched.
    Then the first machine comes back to the scratch it kept, at the first stop: a start resumed from scratch's
    step 0 and computed again the pairs done since; it now fetches the remote's further one in its place, and
    `run --check` says so (daemon/jobs/pass_resume.py)."""
    values = dict(data={"val_windows": 8},
                  train={"seq_len": 128, "micro_batch_size": 1, "max_steps": 2, "checkpoint_every": 2})
    config = write_config(tmp_path, dpo_corpus, name="moved", **values)
    cfg = load_config(config)
    remote, step0 = Path(cfg.run.remote), "step-00000000"
    _stopped_under_supervisor(config, tmp_path, beyond=0)
    first = _kept_pairs(remote / step0)
    assert first == _kept_pairs(cfg.checkpoint_dir / step0)  # the first stop reached the remote, as before
    kept_scratch = tmp_path / "first-machine-scratch"  # its local disk, kept: the machine comes back later
    shutil.copytree(cfg.scratch_dir, kept_scratch, symlinks=True)
    teammates = {remote / "notes.txt": b"a teammate's notes", remote / "shared" / "data.bin": b"\x00data",
                 remote / ".tmp-step-00000000-elsewhere-4242" / "manifest.json": b"{}"}
    for path, data in teammates.items():
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)

    shutil.rmtree(cfg.scratch_dir)  # a new machine: only the remote (and run.dir, on the shared file system) kept
    _stopped_under_supervisor(config, tmp_path, beyond=first)
    second = _kept_pairs(cfg.checkpoint_dir / step0)
    assert second > first
    assert _kept_pairs(remote / step0) == second  # before: still `first`, what a new machine then went on from
    assert (remote / step0 / DPO_REFERENCE).read_bytes() == (cfg.checkpoint_dir / step0 / DPO_REFERENCE).read_bytes()

    # the first machine back (a reboot into its local disk, a requeue onto its node), its scratch at the first stop:
    # the run goes on from the remote's second (before: from its own first, the pairs since computed again), and ends
    shutil.rmtree(cfg.scratch_dir)
    shutil.copytree(kept_scratch, cfg.scratch_dir, symlinks=True)
    checked = cli("run", "--check", str(config), timeout=120)
    total = json.loads((remote / step0 / MANIFEST).read_text())[REFERENCE_PASS][1]
    assert f"resumes from step 0 (remote: {remote / step0}: run.remote's step 0 is further on (reference pass " \
           f"{second:,}/{total:,} pairs) than scratch's (reference pass {first:,}/{total:,} pairs)" in checked.stdout, \
        checked.stdout + checked.stderr
    assert run_supervisor(config, tmp_path, timeout=600, fake=False) == EXIT_DONE, \
        (tmp_path / "supervisor.out").read_text()
    made = read_metrics(cfg.run_dir, "dpo_reference")
    assert [(m["source"], m.get("resumed_at")) for m in made] == [("computed", second)], made
    assert [e for e in events(cfg.run_dir) if e["event"] == "fetch" and "further on" in e["message"]]
    straight = write_config(tmp_path, dpo_corpus, name="straight", **values)
    assert train_in_process(straight).returncode == EXIT_DONE  # undisturbed: the trainer alone, in this process
    straight_last = run_paths(straight)[1] / "step-00000002"
    for name in ("model.safetensors", "optimizer.safetensors", DPO_REFERENCE):
        assert (remote / "step-00000002" / name).read_bytes() == (straight_last / name).read_bytes(), name
    # the remote's step 0 is the second stop's or the complete one: once the remote holds a later step, which
    # carries every sum, nothing resumes from its step 0 and it is not replaced (tests/test_sync_pass.py)
    complete = (remote / step0 / DPO_REFERENCE).read_bytes() == (straight_last / DPO_REFERENCE).read_bytes()
    assert complete or _kept_pairs(remote / step0) == second
    for path, data in teammates.items():
        assert path.read_bytes() == data, path
    assert sorted(p.name for p in remote.iterdir() if p.name.startswith(".tmp")) == \
        [".tmp-step-00000000-elsewhere-4242"] and not (remote / "quarantine").exists()


def _pass_saved(ckpt_dir: Path) -> int | None:
    """The pairs done of the stopped pass step 0 holds, by its manifest (None: no step 0, or its sums complete)."""
    try:
        return json.loads((ckpt_dir / "step-00000000" / MANIFEST).read_text()).get(REFERENCE_PASS, [None])[0]
    except FileNotFoundError:
        return None


@pytest.mark.slow  # a trainer in a real process, SIGKILLed in its (slowed) reference pass after a periodic save
def test_a_pass_killed_after_a_periodic_save_goes_on_from_it_and_the_run_ends_bit_identical(tmp_path, dpo_corpus):
    """Found by a new user: a pass at 568/2,439 pairs killed with kill -9 started again from 0 (only a stop saved
    it); a run OOM-killed or hang-killed in an hours-long pass never got past it. The pass now saves step 0 with the
    sums so far every train.checkpoint_every, as a stop does; a kill loses the pass since that save only, and the
    resumed run ends with the weights, optimizer state and reference of an undisturbed run, byte for byte."""
    values = dict(data={"val_windows": 8},
                  # keep_local: a loaded machine takes over 1 s a step and saves step 1 as well; two kept would
                  # prune step 0, which the comparison below reads (a suite run under load failed so)
                  train={"seq_len": 128, "micro_batch_size": 1, "max_steps": 2, "checkpoint_every": "1s",
                         "keep_local": 5})
    config = write_config(tmp_path, dpo_corpus, name="killref", **values)
    run_dir, ckpt_dir = run_paths(config)
    cmd = [sys.executable, str(SLOW_REFERENCE_TRAINER), "train", str(config)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env()) as proc:
        try:
            while proc.poll() is None and not _pass_saved(ckpt_dir):
                time.sleep(0.1)
            proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, out  # killed, not ended: on before, the pass saved nothing until done
    kept = _pass_saved(ckpt_dir)  # the newest save before the kill (another may have landed since the look)
    total = json.loads((ckpt_dir / "step-00000000" / MANIFEST).read_text())[REFERENCE_PASS][1]
    assert kept is not None and 0 < kept < total, out
    assert f"saving {ckpt_dir / 'step-00000000'}" in out and not read_metrics(run_dir, "dpo_reference"), out
    again = train_in_process(config)  # the real trainer: the pass goes on from the periodic save, then trains
    assert again.returncode == EXIT_DONE, again.stderr
    made = read_metrics(run_dir, "dpo_reference")
    assert [(m["source"], m.get("resumed_at")) for m in made] == [("computed", kept)], made
    assert _pass_saved(ckpt_dir) is None  # step 0 now holds every sum
    straight = write_config(tmp_path, dpo_corpus, name="straight", **values)
    assert train_in_process(straight).returncode == EXIT_DONE
    straight_ckpt = run_paths(straight)[1]
    for step in ("step-00000000", "step-00000002"):
        for name in ("model.safetensors", "optimizer.safetensors", DPO_REFERENCE):
            assert (ckpt_dir / step / name).read_bytes() == (straight_ckpt / step / name).read_bytes(), (step, name)


@pytest.mark.slow  # a supervisor and its real trainer, SIGKILLed in its (slowed) reference pass, restarted
def test_periodic_saves_of_the_pass_reach_the_remote_and_a_killed_trainer_restarts_from_the_newest(
        tmp_path, small_dpo_corpus):
    """Under the supervisor: each periodic save of the pass is synced, a further one in place of the remote's
    (daemon/jobs/sync_pass.py); a trainer SIGKILLed (the OOM killer) restarts from the newest save, not from 0."""
    config = write_config(tmp_path, small_dpo_corpus, name="supkill", data={"val_windows": 8},
                          train={"seq_len": 128, "micro_batch_size": 1, "max_steps": 2, "checkpoint_every": "1s"},
                          restart={"max_restarts": 2})
    cfg = load_config(config)
    remote = Path(cfg.run.remote)
    slow = f"{sys.executable} {SLOW_REFERENCE_TRAINER}"
    sup = start_supervisor(config, tmp_path / "supervisor.out", fake=False, **{TRAINER_CMD_ENV: slow})
    try:
        wait_for(lambda: sup.poll() is not None or _pass_saved(remote), 300, "a periodic save on the remote")
        first = _pass_saved(remote)
        assert first, (tmp_path / "supervisor.out").read_text()
        wait_for(lambda: sup.poll() is not None or (_pass_saved(remote) or 0) > first, 300, "a further one there")
        assert (_pass_saved(remote) or 0) > first, (tmp_path / "supervisor.out").read_text()
        os.kill(state(cfg.run_dir)["child"]["pid"], signal.SIGKILL)
        kept = _pass_saved(cfg.checkpoint_dir)
        assert kept and kept >= first
        assert sup.wait(300) == EXIT_DONE, (tmp_path / "supervisor.out").read_text()
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    made = read_metrics(cfg.run_dir, "dpo_reference")
    assert [(m["source"], m.get("resumed_at")) for m in made] == [("computed", kept)], made
    # the last step carries every sum; the remote's step 0 is replaced only while it is the remote's newest, so it
    # may stay a save of the pass once a later step got there first (tests/test_sync_pass.py)
    last = json.loads((remote / "step-00000002" / MANIFEST).read_text())
    assert DPO_REFERENCE in last["files"] and REFERENCE_PASS not in last, last
    assert (remote / "step-00000000" / MANIFEST).exists()


def test_the_pass_saves_every_checkpoint_every_or_every_5_minutes_when_it_counts_steps(tmp_path, dpo_corpus):
    """A duration counts from the last save (or the pass's start); steps, which the pass takes none of, stand for the
    key's default duration."""
    from minilmd.trainer.loop.saving import PASS_SAVE_EVERY_S, Saves

    assert PASS_SAVE_EVERY_S == 300.0
    for every, not_yet, due in ((2, 200, 301), ("2m", 60, 121)):
        cfg = load_config(write_config(tmp_path, dpo_corpus, name=f"every{every}", train={"checkpoint_every": every}))
        saves = Saves(cfg, None, None, None, None, None)  # type: ignore[arg-type]  # pass_due reads the config alone
        saves.last_time = time.monotonic() - not_yet
        assert not saves.pass_due(), every
        saves.last_time = time.monotonic() - due
        assert saves.pass_due(), every
