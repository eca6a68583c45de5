"""Relative paths in a run config are relative to the config file's directory, and the run's copy of its config
(run.toml in run.dir, which the trainer and every restart read) names them absolute.

Before: they were resolved against the current directory: `run --check` passed from the config's directory and
failed from / (a systemd unit sets no WorkingDirectory), and the copy in run.dir kept them relative, so a restart
from another directory read another place (a relative data.prepared as "share gone").
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from typer.testing import CliRunner

from minilmd import names, run_owner
from minilmd.cli import app
from minilmd.config import load_config, toml_value
from minilmd.names import FAULT_ENV
from supervisor_helpers import env_for, events, state, step_of_state, wait_for, wait_or_kill, write_config


def _relative_config(tmp_path: Path, corpus) -> Path:
    """A config in tmp_path/conf naming its corpus, run.dir and scratch relative to that directory."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "p3").symlink_to(corpus[0])
    path = conf / "rel.toml"
    path.write_text(f'[run]\nname = "rel"\ndir = "run"\nscratch = "../scratch"\nkeep_scratch = true\n'
                    f'[data]\nprepared = "p3"\nval_windows = 4\n'
                    f'[model]\nhidden_size = 32\nnum_hidden_layers = 1\nnum_attention_heads = 2\n'
                    f'num_key_value_heads = 1\nmax_position_embeddings = 256\nvocab_size = {corpus[1]}\n'
                    f'[train]\nseq_len = 32\nmicro_batch_size = 4\ngrad_accum = 1\nmax_steps = 6\n'
                    f'checkpoint_every = 3\ndevice = "cpu"\n')
    return path


def test_relative_paths_are_the_configs_directorys_wherever_it_is_loaded_from(tmp_path, corpus, monkeypatch):
    config = _relative_config(tmp_path, corpus)
    for cwd in ("/", str(tmp_path)):
        monkeypatch.chdir(cwd)
        cfg = load_config(config)
        assert cfg.run_dir == tmp_path / "conf" / "run" and cfg.scratch_dir == tmp_path / "scratch"
        assert cfg.data.prepared == str(tmp_path / "conf" / "p3")
    monkeypatch.chdir(tmp_path)
    given = load_config(config, overrides=['data.prepared="elsewhere"'])  # a --set: the shell's directory
    assert given.data.prepared == str(tmp_path / "elsewhere")


@pytest.mark.slow
def test_run_check_from_root_and_the_runs_copy_name_the_same_places(tmp_path, corpus):
    config = _relative_config(tmp_path, corpus)
    checked = subprocess.run([sys.executable, "-m", "minilmd.cli", "run", "--check", str(config)], cwd="/",
                             capture_output=True, text=True, timeout=120, env=env_for())
    assert checked.returncode == 0, checked
    with open(tmp_path / "sup.out", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "run", str(config)], cwd="/", stdout=out,
                                stderr=subprocess.STDOUT, env=env_for())
        assert wait_or_kill(proc, timeout=180) == 0, (tmp_path / "sup.out").read_text()
    run_dir = tmp_path / "conf" / "run"
    copy = load_config(run_dir / names.RUN_CONFIG_COPY, untrusted=True)  # as a restart from run.dir reads it
    assert copy.data.prepared == str(tmp_path / "conf" / "p3") and copy.run_dir == run_dir
    assert copy.scratch_dir == tmp_path / "scratch"
    # a restart from the copy, in another directory, is the same run: it resumes, never "share gone"
    again = subprocess.run([sys.executable, "-m", "minilmd.cli", "run", "--check", str(run_dir / "run.toml")],
                           cwd=str(tmp_path), capture_output=True, text=True, timeout=120, env=env_for())
    assert again.returncode == 0, again


@pytest.mark.slow
def test_a_supervisor_whose_starting_directory_is_removed_relaunches_its_trainer_and_finishes(tmp_path, corpus):
    """The supervisor's working directory deleted under it (a shell's directory of a finished job, cleaned):
    `--set`'s relative paths were made absolute at start, so a relaunch never asks for the working directory
    (before: Path.cwd() raised FileNotFoundError at the second attempt's command and the supervisor crashed)."""
    config = write_config(tmp_path, corpus, name="nocwd", remote=False, train={"max_steps": 12, "checkpoint_every": 4})
    gone, release = tmp_path / "gone", tmp_path / "release"
    gone.mkdir()
    run_dir = tmp_path / "nocwd" / "run"
    with open(tmp_path / "sup.out", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "run", str(config)], cwd=gone, stdout=out,
                                stderr=subprocess.STDOUT,
                                env=env_for(**{FAULT_ENV: "exception@6", "FAKE_HOLD": f"5:{release}"}))
        try:
            wait_for(lambda: step_of_state(run_dir) >= 5 or proc.poll() is not None, timeout=120)
            gone.rmdir()
            release.touch()
        finally:
            status = wait_or_kill(proc, timeout=180)
    log = (tmp_path / "sup.out").read_text()
    assert status == 0, log
    assert [e for e in events(run_dir) if e.get("event") == "child_exit"][0]["cause"] == "crash", log
    assert state(run_dir)["phase"] == "done" and step_of_state(run_dir) == 12


@pytest.mark.parametrize("key, value", [("run.dir", "~/runs/pt"), ("run.remote", "~/nfs"),
                                        ("data.prepared", "$HOME/corpus"), ("init.from", "${WORK}/pt")])
def test_a_path_with_a_tilde_or_a_variable_is_refused_not_taken_under_the_configs_directory(tmp_path, corpus, key,
                                                                                            value):
    """Before: `dir = "~/runs/pt"` was tmp/cfg/~/runs/pt, --check said OK, and `rm -rf ~` to clean it deletes the
    home. TOML expands neither; refused in the file and in a --set, exit 2 as any config error."""
    section, name = key.split(".")
    config = write_config(tmp_path, corpus)
    raw = tomllib.loads(config.read_text())
    raw.setdefault(section, {})[name] = value
    in_file = tmp_path / "in_file.toml"
    in_file.write_text("".join(f"[{sec}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in body.items())
                               for sec, body in raw.items()))
    for args in (["--check", str(in_file)], ["--check", str(config), "--set", f"{key}={value}"]):
        done = subprocess.run([sys.executable, "-m", "minilmd.cli", "run", *args], capture_output=True, text=True,
                              env=env_for(), timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"{key} = {value!r}: TOML expands neither ~ nor $VAR: write the full path, e.g. " in done.stderr, \
            done.stderr
        assert "OK" not in done.stdout, done.stdout


@pytest.mark.parametrize("key, value", [("run.dir", "~/runs/pt"), ("data.prepared", "$HOME/corpus"),
                                        ("init.from", "~/pt"), ("log.prometheus_textfile", "~/x.prom")])
def test_a_refused_tilde_path_is_said_alone_not_judged_again_as_a_literal_place(tmp_path, corpus, key, value):
    """The checks of the machine that read a path wait until it is valid. Before: after the refusal, run.dir
    = "~/runs/pt" was judged again as `<working directory>/~/runs/pt`, the remote's claim naming the run's real
    run.dir said to be "another run's"; and data.prepared, init.from and the textfile's directory were each said
    missing under a directory named `~` or `$HOME`. (The checks that do not read the path still run: the remote's
    claim is said beside a refused data.prepared when another run's.)"""
    remote = tmp_path / "remote"
    remote.mkdir()
    if key == "run.dir":  # claimed by the run the user means: its run.dir is ~/runs/pt expanded
        expanded = Path(os.path.expanduser("~/runs/pt"))
        (remote / names.REMOTE_OWNER).write_bytes(run_owner.encode(run_owner.record(expanded, "t")))
    section, name = key.split(".")
    sections = {"run": {"remote": str(remote)}}
    sections.setdefault(section, {})[name] = value
    config = write_config(tmp_path, corpus, remote=False, **sections)
    done = CliRunner().invoke(app, ["run", "--check", str(config)])
    assert done.exit_code == 2, done.output
    said = " ".join(done.output.split())
    assert "1 problem(s)" in said and f"{key} = {value!r}: TOML expands neither ~ nor $VAR" in said, said
