"""`run --check` of a config whose run is running says what its edits do: they apply at the run's next start (the
running supervisor restarts its trainer from RUN_DIR/run.toml), how to get there, and which keys the edited config
changes against that copy (daemon/runningedits.py). Before (user report 9, finding 8), it said only "run already
owned by another supervisor", and a restart after a crash kept the old lr with nothing saying so."""
from __future__ import annotations

import shutil
import subprocess
import sys

from minilmd import names
from minilmd.config import load_config
from minilmd.protocol import SUPERVISOR_CONFIG
from supervisor_helpers import cli, env_for, write_config

HOLD_THE_LOCK = """
import sys, time
from minilmd.daemon.host.lock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_check_of_a_running_run_says_edits_apply_at_its_next_start(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False)
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    shutil.copy(config, cfg.run_dir / names.RUN_CONFIG_COPY)  # the copy its supervisor made at the start
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(cfg.run_dir)], stdout=subprocess.PIPE,
                              text=True, env=env_for())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        same = cli("run", "--check", str(config))
        edited = cli("run", "--check", str(config), "--set", "train.lr=0.0002", "--set", "train.max_steps=60")
    finally:
        holder.kill()
        holder.wait()
    said = edited.stdout + edited.stderr
    assert edited.returncode == SUPERVISOR_CONFIG, said
    assert f"run already owned by another supervisor: pid {holder.pid} on " in said, said
    assert (f"a running run keeps the config it started with ({cfg.run_dir / names.RUN_CONFIG_COPY}, which its "
            f"restarts read too): edits to this file apply at its next start (`minilmd stop {cfg.run_dir}`, then "
            f"`minilmd run {config}`); this config changes, against that copy: train.lr = 0.0002 (running: 0.003), "
            f"train.max_steps = 60 (running: 30)") in said, said
    assert "this config is the same as that copy" in same.stdout + same.stderr


def test_a_second_config_on_a_running_run_dir_is_told_to_take_its_own(tmp_path, corpus):
    """A new user's second config (its own run.name, remote and model) naming the run.dir of a running run was told
    `edits to this file apply at its next start (minilmd stop ..., then minilmd run B)`: following it stopped the
    healthy run, and B was then refused all the same."""
    config = write_config(tmp_path, corpus, remote=False)
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    shutil.copy(config, cfg.run_dir / names.RUN_CONFIG_COPY)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(cfg.run_dir)], stdout=subprocess.PIPE,
                              text=True, env=env_for())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        other = cli("run", "--check", str(config), "--set", 'run.name="sameB"', "--set", "model.hidden_size=64")
    finally:
        holder.kill()
        holder.wait()
    said = " ".join((other.stdout + other.stderr).split())
    assert other.returncode == SUPERVISOR_CONFIG, said
    assert (f"{cfg.run_dir} is the run directory of the running run {cfg.run.name!r}, not of this config's run "
            f"'sameB': two runs need two run directories, so give this config a run.dir (and a run.remote) of its "
            f"own") in said, said
    assert "edits to this file apply" not in said, said
