"""A waiting stage knows whether its predecessor is alive. Two real supervisors (the fake trainer): the later
stage waits in waiting_init while the earlier one trains, then the earlier supervisor is SIGKILLed and its trainer
trains on as an orphan.

Before: the waiting stage kept saying `run ... is training at step N` for ever (it read only state.json's phase),
wrote an `[init_wait]` line at every poll (the step is in the text), and the killed supervisor's own `status`
said nothing of the trainer still running. Now the waiting stage's status, its state.json and its Prometheus
gauges say "predecessor X is not running since T" (a wait, not a failure: systemd may restart it), a line is
logged only when the predecessor's phase or liveness changes, and the killed supervisor's status names its
trainer's pid and heartbeat step.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import RunState, new_state, process_start_ticks
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.host.prometheus import render
from minilmd.daemon.phases import initwait
from minilmd.daemon.views.status import summary_lines
from minilmd.fsio import atomic_write_json
from supervisor_helpers import cli, events, start_supervisor, state, wait_or_kill, write_config
from waiting import wait_until


def answered_tick(waiter: initwait.InitWaiter):
    """One poll of the predecessor taken to its answer: a tick starts it in its thread, a later one takes it."""
    outcome = waiter.tick()
    while waiter.poll is not None:
        wait_until(lambda: waiter.poll.done, timeout=60, what="the poll of the predecessor")
        outcome = waiter.tick()
    return outcome


def test_the_waiter_logs_phase_and_liveness_changes_not_steps(tmp_path, corpus, monkeypatch):
    """InitWaiter against a predecessor whose "supervisor" is a real process: its steps are not news, its phase
    and its death are; the gauge follows."""
    monkeypatch.setattr(initwait, "POLL_S", 0.0)
    first = write_config(tmp_path, corpus, name="sft")
    second = load_config(write_config(tmp_path, corpus, name="lora", init={"from": str(first)}))
    pred_dir = load_config(first).run_dir
    pred_dir.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        body = new_state("sft", pred_dir, str(first))
        wait_until(lambda: process_start_ticks(sleeper.pid), what="the sleeper's start time")
        body["supervisor"].update(pid=sleeper.pid, start_ticks=process_start_ticks(sleeper.pid))
        said: list[str] = []
        waiter = initwait.InitWaiter(second, RunState(tmp_path / names.STATE, new_state("lora", tmp_path, "x")),
                                     lambda event, message, **_: said.append(message))
        for phase, step in (("staging", None), ("training", 1), ("training", 2), ("training", 3)):
            body.update(phase=phase, progress={"step": step}, updated=time.time())
            atomic_write_json(pred_dir / names.STATE, body)
            assert answered_tick(waiter) is None
        assert said == ["init.from: run sft is staging", "init.from: run sft is training at step 1"], said
        assert waiter.state.init_wait.running is True and waiter.state.init_wait.checks == 4
    finally:
        sleeper.kill()
        sleeper.wait()
    answered_tick(waiter)
    answered_tick(waiter)
    wait = waiter.state.init_wait
    assert wait.running is False and wait.not_running_since == body["updated"], wait
    assert len(said) == 3 and said[-1].startswith("init.from: predecessor sft is not running since "), said
    assert "(its supervisor is gone; its state.json last said: run sft is training at step 3; it may be restarted: " \
           "this run waits)" in said[-1], said
    # status says one thing: not running, with "training" as what its state.json last said (user6 #8: before,
    # "waiting for init.from: run sft is training at step 3" and, on the next line, "predecessor sft is not running")
    shown = summary_lines(StateJson.from_dict({**waiter.state.data, "phase": "waiting_init"}), alive=True)
    waiting = [line for line in shown if "init.from" in line or "predecessor" in line]
    assert len(waiting) == 1 and waiting[0].startswith("  waiting for init.from: predecessor sft is not running "
                                                       "since "), shown
    assert "last said: run sft is training at step 3;" in waiting[0], waiting
    gauges = render({**waiter.state.data, "phase": "waiting_init"}, time.time())
    assert 'minilmd_predecessor_up{run="lora",predecessor="sft"} 0' in gauges, gauges
    assert 'minilmd_predecessor_down_timestamp_seconds{run="lora",predecessor="sft"} ' in gauges, gauges


@pytest.mark.slow  # two supervisors, a fake trainer of a few hundred steps: ~30 s
def test_a_waiting_stage_sees_its_predecessor_die_and_logs_only_changes(tmp_path, corpus):
    first = write_config(tmp_path, corpus, name="sft", train={"max_steps": 100_000, "checkpoint_every": 1000})
    prom = tmp_path / "lora.prom"
    second = write_config(tmp_path, corpus, name="lora", init={"from": str(first)},
                          log={"prometheus_textfile": str(prom)})
    first_dir, second_dir = load_config(first).run_dir, load_config(second).run_dir
    pred = start_supervisor(first, tmp_path / "sft.out", FAKE_STEP_S="0.05")
    succ = start_supervisor(second, tmp_path / "lora.out")
    trainer = None
    try:
        wait_until(lambda: (state(second_dir).get("init_wait") or {}).get("running") is True
                   and state(second_dir)["init_wait"]["why"].startswith("run sft is training at step "),
                   timeout=120, what="the wait on a run that trains")
        step_then = state(first_dir)["progress"]["step"]
        checks_then = state(second_dir)["init_wait"]["checks"]
        said_then = [e for e in events(second_dir) if e["event"] == "init_wait"]
        wait_until(lambda: state(second_dir)["init_wait"]["checks"] >= checks_then + 3
                   and state(first_dir)["progress"]["step"] > step_then + 10, timeout=120,
                   what="three more polls while the predecessor steps on")
        said = [e for e in events(second_dir) if e["event"] == "init_wait"]
        assert said == said_then and said[-1]["message"].startswith("init.from: run sft is training"), said

        trainer = state(first_dir)["child"]["pid"]
        os.kill(pred.pid, signal.SIGKILL)
        pred.wait(timeout=60)
        wait_until(lambda: state(second_dir)["init_wait"].get("running") is False, timeout=120,
                   what="the waiting stage to see its predecessor gone")
        wait = state(second_dir)["init_wait"]
        assert wait["not_running"].startswith("predecessor sft is not running since "), wait
        assert state(second_dir)["phase"] == "waiting_init" and succ.poll() is None  # a wait, not a failure
        shown = cli("status", str(second_dir)).stdout
        assert "  waiting for init.from: predecessor sft is not running since " in shown, shown
        assert "\n  predecessor sft" not in shown and "\n  waiting for init.from: run sft is" not in shown, shown
        overview = cli("status").stdout  # every run of this user: the note under the table
        assert "lora: waiting for init.from: predecessor sft is not running since " in overview, overview
        wait_until(lambda: prom.exists() and 'minilmd_predecessor_up{run="lora",predecessor="sft"} 0'
                   in prom.read_text(), timeout=60, what="the gauge")
        assert "minilmd_predecessor_down_timestamp_seconds{" in prom.read_text()
        said_after = [e for e in events(second_dir) if e["event"] == "init_wait"]
        assert "is not running since" in said_after[-1]["message"], said_after

        killed = cli("status", str(first_dir)).stdout
        assert f"trainer still running without its supervisor: pid {trainer} (heartbeat at step " in killed, killed
    finally:
        for proc in (pred, succ):
            if proc.poll() is None:
                proc.terminate()
        wait_or_kill(succ, 120)
        stopped = cli("stop", str(first_dir), timeout=180)  # the orphaned trainer: SIGTERM, it saves and exits
        assert stopped.returncode in (0, 3), stopped
    assert "Traceback" not in Path(tmp_path / "lora.out").read_text()


def test_check_of_a_stage_whose_predecessor_has_not_finished_says_it_will_wait_and_on_what(tmp_path, corpus):
    from typer.testing import CliRunner

    from minilmd.cli import app

    first = write_config(tmp_path, corpus, name="pre")
    second = write_config(tmp_path, corpus, name="sft", init={"from": str(first)})
    not_started = CliRunner().invoke(app, ["run", "--check", str(second)])
    assert not_started.exit_code == 0, not_started.output
    pred_dir = load_config(first).run_dir
    assert (f"waits: init.from = '{first}': run pre has not started ({pred_dir / names.STATE} not there "
            f"yet)") in not_started.output  # issue 24: it said only OK
    pred_dir.mkdir(parents=True)
    atomic_write_json(pred_dir / names.STATE, {"phase": "training", "progress": {"step": 12}})
    training = CliRunner().invoke(app, ["run", "--check", str(second)])
    assert training.exit_code == 0, training.output
    assert f"waits: init.from = '{first}': run pre is training at step 12;" in training.output
    alone = CliRunner().invoke(app, ["run", "--check", str(first)])
    assert alone.exit_code == 0 and "wait" not in alone.output  # no init.from: nothing to wait for


def test_check_of_a_stage_of_another_model_than_its_unfinished_predecessor_is_refused_now(tmp_path, corpus):
    """A stage whose [model] differs from its predecessor's config: on main `--check` said OK (the predecessor had
    not finished, so nothing was compared), and the stage failed with exit 2 only when it had finished, hours
    later with nobody watching. The predecessor's config is what its final checkpoint will hold: refused now."""
    from typer.testing import CliRunner

    from minilmd.cli import app

    first = write_config(tmp_path, corpus, name="pre")
    hidden = load_config(first).model.hidden_size
    second = write_config(tmp_path, corpus, name="sft", init={"from": str(first)},
                          model={"hidden_size": 2 * hidden})
    refused = CliRunner().invoke(app, ["run", "--check", str(second)])
    assert refused.exit_code == 2, refused.output
    assert f"model.hidden_size: source {hidden}, run {2 * hidden}" in refused.output, refused.output
    assert "run pre" in refused.output, refused.output


def test_a_predecessor_named_by_its_pid_alone_is_not_taken_for_running(tmp_path):
    """A state.json whose supervisor has a pid and no start time (damaged, hand-made, another user's): that pid is
    whichever process has it now, here a live process of ours that is no supervisor (before: "running")."""
    pred_dir = tmp_path / "sft"
    pred_dir.mkdir()
    body = new_state("sft", pred_dir, "x")
    body["supervisor"].update(pid=os.getpid(), start_ticks=None)
    live = initwait.predecessor_liveness(initwait.Predecessor("sft", pred_dir, tmp_path / "remote"), body)
    assert live is not None and (live.running, live.detail) == (False, "its supervisor is gone")
    body["supervisor"].update(start_ticks=process_start_ticks(os.getpid()))  # the same, with its start time
    assert initwait.predecessor_liveness(initwait.Predecessor("sft", pred_dir, tmp_path / "remote"), body).running


@pytest.mark.slow  # a launch in a subprocess
def test_check_and_launch_of_a_stage_whose_init_from_names_itself_refuse_it(tmp_path, corpus):
    """Found by a new user: a stage whose init.from named its own config passed `run --check` (`waits: init.from =
    ...: run sft has not started ...; the run waits for it to finish`) and its launch waited in waiting_init for
    itself, for ever. Refused at once instead, exit 2, by --check and by the launch (nothing made), named by its
    config or by its run directory; so are two stages that name each other."""
    import shutil

    from typer.testing import CliRunner

    from minilmd.cli import app

    config = write_config(tmp_path, corpus, name="sft")
    write_config(tmp_path, corpus, name="sft", init={"from": str(config)})
    run_dir = load_config(config).run_dir
    checked = CliRunner().invoke(app, ["run", "--check", str(config)])
    assert checked.exit_code == 2, checked.output
    assert (f"init.from = '{config}': names this run itself (run sft, run.dir {run_dir}): it would wait for its own "
            f"final checkpoint forever") in " ".join(checked.output.split()), checked.output
    launched = cli("run", str(config), timeout=120)
    assert launched.returncode == 2 and "names this run itself" in launched.stderr + launched.stdout, launched
    assert not run_dir.exists()
    run_dir.mkdir(parents=True)  # named by its run directory, which holds the supervisor's copy of its config
    shutil.copy(config, run_dir / names.RUN_CONFIG_COPY)
    write_config(tmp_path, corpus, name="sft", init={"from": str(run_dir)})
    by_dir = CliRunner().invoke(app, ["run", "--check", str(config)])
    assert by_dir.exit_code == 2 and "names this run itself" in by_dir.output, by_dir.output
    other = write_config(tmp_path, corpus, name="dpo", init={"from": str(config)})  # two stages naming each other
    write_config(tmp_path, corpus, name="sft", init={"from": str(other)})
    looped = CliRunner().invoke(app, ["run", "--check", str(config)])
    assert looped.exit_code == 2 and (
        f"init.from = '{other}': run dpo starts from this run in turn (its init.from = '{config}'): each would wait "
        f"for the other to finish, forever") in " ".join(looped.output.split()), looped.output
