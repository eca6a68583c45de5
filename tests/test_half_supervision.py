"""A trainer with half of what a supervisor gives it is refused at its start (minilmd/supervision.py, house9 #4).

The supervisor sets MINILMD_RUN_DIR (the trainer leaves pruning, scratch's claim and the remote to it) and
MINILMD_SUPERVISOR_PROCESS (its identity: the trainer stops once it is gone) together. Before, only the first was
asked whether the trainer is supervised: one started with it and without the second trained "supervised", pruning
nothing, with nobody watching it. Now the real `minilmd train` refuses it, and an identity without a run directory,
in one line naming both variables, exit 2, before anything is read or made."""
from __future__ import annotations

import os
import socket
import subprocess

import pytest

from minilmd import names, protocol
from minilmd.daemon.child.process import supervisor_identity
from minilmd.supervision import Supervision, SupervisionRefused, supervision
from minilmd.supervisor_gone import pid_namespace
from trainer_corpus import child_env, train_cmd, write_config


@pytest.mark.parametrize("half", ["run dir alone", "identity alone"])
def test_the_real_trainer_with_half_a_supervision_is_refused_in_one_line_and_trains_nothing(tmp_path, corpus, half):
    config = write_config(tmp_path, corpus)
    run_dir = tmp_path / "t" / "run"
    run_dir.mkdir(parents=True)  # as the supervisor makes it before a launch
    env = child_env()
    env.pop(names.RUN_DIR_ENV, None)
    env.pop(names.SUPERVISOR_PROCESS_ENV, None)
    if half == "run dir alone":
        env[names.RUN_DIR_ENV] = str(run_dir.resolve())
    else:
        env[names.SUPERVISOR_PROCESS_ENV] = supervisor_identity()
    done = subprocess.run(train_cmd(config), env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == protocol.EXIT_CONFIG, done.stderr
    assert len(said) == 1 and said[0].startswith("minilmd: "), done.stderr  # the command line's entry says it
    assert names.RUN_DIR_ENV in said[0] and names.SUPERVISOR_PROCESS_ENV in said[0] and "refused" in said[0], said
    assert sorted(os.listdir(run_dir)) == [], "nothing written in run.dir (no metrics, heartbeat or log)"
    assert not (tmp_path / "t" / "scratch").exists(), "scratch not claimed, no trainer.lock, no checkpoint"


@pytest.mark.parametrize("command", [["status"], ["run", "--check", "no-such.toml"]])
def test_any_command_with_half_a_supervision_says_so_in_one_line_not_a_traceback(tmp_path, command):
    """`minilmd run` or `status` from a shell that exported one of the two (a wrapper script copied from a trainer's
    environment) asks supervision() deep inside (scratch's root, the probes): refused at the entry, exit 2."""
    env = child_env()
    env.pop(names.SUPERVISOR_PROCESS_ENV, None)
    env[names.RUN_DIR_ENV] = str(tmp_path)
    done = subprocess.run([*train_cmd(tmp_path / "x.toml")[:3], *command], env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, cwd=tmp_path)
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == protocol.EXIT_CONFIG, done.stderr
    assert len(said) == 1 and said[0].startswith("minilmd: ") and names.RUN_DIR_ENV in said[0], done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_supervision_reads_what_the_supervisor_sets_and_refuses_a_malformed_identity():
    ours = {names.RUN_DIR_ENV: "/runs/a", names.SUPERVISOR_PROCESS_ENV: supervisor_identity()}
    got = supervision(ours)
    assert got is not None and got.run_dir == "/runs/a" and got.pid == os.getpid() and got.host == socket.gethostname()
    assert got.start_ticks > 0 and got.pid_namespace == pid_namespace()
    assert supervision({names.RUN_DIR_ENV: "/r", names.SUPERVISOR_PROCESS_ENV: "7 8 host"}) == Supervision(
        "/r", 7, 8, "host", 0)  # an older supervisor's, without its pid namespace
    assert supervision({}) is None and supervision({names.RUN_DIR_ENV: "", names.SUPERVISOR_PROCESS_ENV: ""}) is None
    for identity in ("", "7 None host", "7 8", "7 8 host 9 10", "x 8 host", "7 8 host ns"):
        with pytest.raises(SupervisionRefused):
            supervision({names.RUN_DIR_ENV: "/r", names.SUPERVISOR_PROCESS_ENV: identity})
