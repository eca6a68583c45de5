"""deploy/: the systemd unit (checked by `systemd-analyze verify` and against protocol.py), the tmux launcher (driven
headless on a private tmux server with a stand-in `minilmd` that records how it was called) and the example run
config (complete, valid, and its arithmetic true)."""
from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from deploy_helpers import UNIT, launcher, launcher_config, parse_unit, systemd_seconds  # noqa: F401 - a fixture
from minilmd.config import RunConfig, config_from_dict, toml_key
from minilmd.model_shapes import expected_state_shapes
from minilmd.plan.budget import total_steps_for_budget
from minilmd.probes import load_checked
from minilmd.protocol import FINAL_EXIT_STATUSES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "deploy" / "example.toml"


# --- systemd unit ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT.read_text(encoding="utf-8"))


def test_unit_never_restarts_on_the_final_exit_statuses(unit):
    prevent = unit["Service"]["RestartPreventExitStatus"]
    assert len(prevent) == 1
    assert sorted(int(s) for s in prevent[0].split()) == sorted(FINAL_EXIT_STATUSES)
    assert unit["Service"]["Restart"] == ["on-failure"]


def test_unit_stops_through_the_supervisor_and_waits_for_the_final_save(unit):
    service = unit["Service"]
    assert service["KillMode"] == ["mixed"]
    assert service["KillSignal"] == ["SIGTERM"]
    assert systemd_seconds(service["TimeoutStopSec"][0]) >= 10 * 60
    # the OOM killer taking the trainer must not stop the supervisor with it
    assert service["OOMPolicy"] == ["continue"]


def test_unit_talks_sd_notify_and_logs_to_the_journal(unit):
    service = unit["Service"]
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert systemd_seconds(service["WatchdogSec"][0]) > 0
    assert service["StandardOutput"] == ["journal"]
    assert service["StandardError"] == ["journal"]


def test_unit_runs_the_config_named_by_the_instance(unit):
    assert unit["Service"]["ExecStart"] == ["/usr/bin/env minilmd run %E/minilmd/%i.toml"]


def systemd_verify(path: Path, user: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    command = ["systemd-analyze"]
    if user:
        # the user manager needs a runtime directory; a private one keeps the test off any real session
        runtime = path.parent / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
        command.append("--user")
    return subprocess.run([*command, "verify", "--man=no", str(path)], capture_output=True, text=True, env=env,
                          timeout=60)


needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                           reason="systemd-analyze is not installed")


@needs_systemd_analyze
@pytest.mark.parametrize("user", [True, False], ids=["user", "system"])
def test_systemd_analyze_verify_accepts_the_unit(tmp_path, user):
    # verify both the template and an instance of it (specifiers expanded)
    for name in ("minilmd@.service", "minilmd@pretrain-768x8.service"):
        copy = tmp_path / name
        shutil.copy(UNIT, copy)
        result = systemd_verify(copy, user)
        # verify exits 0 on unknown keys and unparsable values and only prints them: any output is a finding
        assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


@needs_systemd_analyze
def test_systemd_analyze_verify_reports_a_broken_unit(tmp_path):
    """The check above can fail: a wrong value and an unknown key are reported."""
    broken = tmp_path / "minilmd@x.service"
    broken.write_text(UNIT.read_text(encoding="utf-8").replace("KillMode=mixed", "KillMode=mixd\nRestartt=no"))
    result = systemd_verify(broken, user=False)
    output = result.stdout + result.stderr
    assert "mixd" in output and "Restartt" in output


def test_the_units_path_finds_minilmd_linked_as_documented(tmp_path, unit):
    """The unit's PATH plus the documented `ln -s .venv/bin/minilmd ~/.local/bin/minilmd` gives a working minilmd."""
    venv_minilmd = Path(sys.executable).parent / "minilmd"
    if not venv_minilmd.exists():
        pytest.skip(f"no console script at {venv_minilmd} (package not installed in this interpreter's env)")
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "minilmd").symlink_to(venv_minilmd)
    [path_setting] = [v for v in unit["Service"]["Environment"] if v.startswith("PATH=")]
    unit_path = path_setting.removeprefix("PATH=").replace("%h", str(home))
    result = subprocess.run(["/usr/bin/env", "minilmd", "--help"], capture_output=True, text=True, timeout=60,
                            env={"PATH": unit_path, "HOME": str(home), "LANG": "C.UTF-8"})
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout


# --- tmux launcher --------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_launcher_starts_supervisor_and_logs_once_and_restarts_an_ended_supervisor(launcher):
    run_dir = launcher.root / "runs" / "demo"
    config = launcher_config(launcher.root / "demo.toml", "demo.run", str(run_dir))
    session = "minilmd-demo_run"  # '.' is not allowed in tmux session names

    first = launcher("--no-attach", str(config), MINILMD_FAULT="oom@3")
    assert first.returncode == 0, first.stderr
    records = launcher.records(2)
    windows = launcher.windows(session)
    assert [(i, name) for i, name, _, _ in windows] == [(0, "run"), (1, "logs")]
    pid_of = {name: pid for _, name, pid, _ in windows}
    by_argv = {r["argv"][0]: r for r in records}
    assert len(records) == 2 and set(by_argv) == {"run", "logs"}
    assert by_argv["run"]["argv"] == ["run", str(config)]
    assert by_argv["logs"]["argv"] == ["logs", "-f", str(config)]  # minilmd resolves its run.dir
    # the supervisor runs under window run's restart loop (its pane's process); logs is the pane's process itself
    assert by_argv["run"]["ppid"] == pid_of["run"] and by_argv["logs"]["pid"] == pid_of["logs"]
    assert by_argv["run"]["fault"] == "oom@3"  # MINILMD_* reaches the supervisor through the tmux server

    second = launcher("--no-attach", str(config))
    assert second.returncode == 0, second.stderr
    assert launcher.windows(session) == windows  # same windows, same processes: no second supervisor
    assert len(launcher.records(2)) == 2
    assert "attach -t " + session in second.stdout

    os.kill(by_argv["run"]["pid"], signal.SIGTERM)  # a clean end for systemd's Restart=on-failure: not restarted
    launcher.wait_dead(session, "run")
    third = launcher("--no-attach", str(config))
    assert third.returncode == 0, third.stderr
    records = launcher.records(3)
    assert [r["argv"][0] for r in records].count("run") == 2
    windows = launcher.windows(session)
    assert [(i, name, dead) for i, name, _, dead in windows] == [(0, "run", False), (1, "logs", False)]
    assert dict((name, pid) for _, name, pid, _ in windows)["logs"] == pid_of["logs"]
    assert records[-1]["argv"] == ["run", str(config)] and records[-1]["pid"] != pid_of["run"]


@pytest.mark.slow
def test_a_minilmd_variable_of_an_earlier_launch_never_reaches_another_runs_supervisor(launcher):
    """tmux gives a new session the environment of the launch that started its server: a demo launched with
    MINILMD_FAULT first must not inject faults into the user's real run launched after it on the same server."""
    demo = launcher_config(launcher.root / "demo.toml", "demo", str(launcher.root / "runs" / "demo"))
    real = launcher_config(launcher.root / "real.toml", "real", str(launcher.root / "runs" / "real"))
    assert launcher("--no-attach", str(demo), MINILMD_FAULT="sigbus@3").returncode == 0  # starts the server
    assert launcher("--no-attach", str(real)).returncode == 0
    runs = {r["argv"][1]: r for r in launcher.records(4) if r["argv"][0] == "run"}
    assert runs[str(demo)]["fault"] == "sigbus@3" and runs[str(real)]["fault"] is None, runs


@pytest.mark.slow
def test_every_window_runs_the_same_command_without_the_launchers_own_variables(launcher):
    """The first launch starts the tmux server with its own environment, MINILMD_TMUX_SOCKET in it: its windows
    must not inherit the launcher's variables any more than those of a later launch on that server (before, only
    the later ones were started through `env -u MINILMD_TMUX_SOCKET`)."""
    configs = [launcher_config(launcher.root / f"{name}.toml", name, str(launcher.root / "runs" / name))
               for name in ("first", "second")]
    said = []
    for config in configs:
        out = launcher("--no-attach", str(config), MINILMD_TMUX_RESTART_SEC="7")
        assert out.returncode == 0, out.stderr
        said += [line for line in out.stdout.splitlines() if "started window" in line]
    commands = [re.sub(r".*: started window (\w+): ", r"\1: ", line).replace("first", "X").replace("second", "X")
                for line in said]
    assert len(commands) == 4 and commands[0] == commands[2] and commands[1] == commands[3], said
    assert all("-u MINILMD_TMUX_SOCKET" in c and "-u MINILMD_TMUX_RESTART_SEC" in c for c in commands), said
    records = launcher.records(4)
    assert [r["launcher_vars"] for r in records] == [[]] * 4, records


def test_launcher_names_the_session_from_the_file_or_the_argument_and_resolves_paths(launcher):
    work = launcher.root / "work"
    work.mkdir()
    launcher_config(work / "nameless.toml", None, "runs/x")

    assert launcher("--no-attach", "nameless.toml", cwd=work).returncode == 0
    assert launcher("--no-attach", "nameless.toml", "mine", cwd=work).returncode == 0
    records = launcher.records(4)
    assert [name for _, name, _, _ in launcher.windows("minilmd-nameless")] == ["run", "logs"]
    assert [name for _, name, _, _ in launcher.windows("mine")] == ["run", "logs"]
    # the config's path becomes absolute (a tmux server has its own working directory); the windows start in cwd;
    # window logs gets the config: its relative run.dir is minilmd's to resolve (tests/test_deploy_audit.py)
    assert {tuple(r["argv"]) for r in records} == {("run", str(work / "nameless.toml")),
                                                  ("logs", "-f", str(work / "nameless.toml"))}
    assert {r["cwd"] for r in records} == {str(work)}


def test_launcher_refuses_what_it_cannot_run_and_says_why(launcher):
    missing = launcher("--no-attach", str(launcher.root / "nope.toml"))
    assert missing.returncode == 2 and "nope.toml" in missing.stderr

    no_dir = launcher_config(launcher.root / "nodir.toml", "x", None)
    result = launcher("--no-attach", str(no_dir))
    assert result.returncode == 2 and "run.dir" in result.stderr and "nodir.toml" in result.stderr

    bad = launcher.root / "bad.toml"
    bad.write_text("[run\n")
    result = launcher("--no-attach", str(bad))
    assert result.returncode == 2 and "bad.toml" in result.stderr

    good = launcher_config(launcher.root / "good.toml", "x", "/tmp/x")
    result = launcher("--no-attach", str(good), MINILMD=str(launcher.root / "no-such-minilmd"))
    assert result.returncode == 1 and "MINILMD" in result.stderr

    assert launcher("--bogus", str(good)).returncode == 2
    # nothing was started by any of these
    assert launcher.tmux("list-sessions").returncode != 0
    assert not launcher.record.exists()


# --- example run config ---------------------------------------------------------------------------------------------

def test_example_config_is_valid_and_is_the_notes_768x8_run():
    cfg = config_from_dict(tomllib.loads(EXAMPLE.read_text(encoding="utf-8")), str(EXAMPLE))
    m, t = cfg.model, cfg.train
    assert (m.hidden_size, m.num_hidden_layers, m.num_attention_heads, m.num_key_value_heads, m.vocab_size) == (
        768, 8, 8, 4, 6400)
    assert sum(map(math.prod, expected_state_shapes(m).values())) == 63_912_192  # the figure in the file's header
    assert (t.seq_len, t.micro_batch_size, t.max_tokens) == (340, 32, 20_000_000)
    tokens_per_step = t.seq_len * t.micro_batch_size * t.grad_accum * cfg.gpu.count
    steps = total_steps_for_budget(cfg, t.micro_batch_size * t.grad_accum * cfg.gpu.count)  # the trainer's rule
    assert steps == 1839 and f"{t.max_tokens:,} / {tokens_per_step:,} = {steps:,} steps" in EXAMPLE.read_text()
    assert cfg.scratch_is_default and cfg.scratch_dir == Path(f"/dev/shm/minilmd-{os.geteuid()}/{cfg.run.name}")


COMMENTED_OUT = {"dpo"}
"""Sections the example writes commented out: a config that writes [dpo] means a DPO stage, and `run --check` notes
it on any other corpus (minilmd/stage_notes.py dpo_ignored), so a copy of the example for pretraining or SFT must
not carry it live."""


def test_example_config_writes_out_every_key_of_the_schema():
    text = EXAMPLE.read_text(encoding="utf-8")
    raw = tomllib.loads(text)
    schema = {f.name: {toml_key(g.name) for g in fields(f.default_factory())} for f in fields(RunConfig)
              if f.name != "source"}
    assert {section: set(body) for section, body in raw.items()} == {
        section: keys for section, keys in schema.items() if section not in COMMENTED_OUT}
    # the commented-out sections, uncommented, hold every key of theirs too
    uncommented = tomllib.loads(re.sub(r"(?m)^# (\[[a-z_]+\]|[a-z_]+ = .*)$", r"\1", text))
    assert {section: set(uncommented[section]) for section in COMMENTED_OUT} == {
        section: schema[section] for section in COMMENTED_OUT}


def test_example_config_comments_every_key():
    """Each key line belongs to a run of key lines that a comment introduces."""
    uncommented = []
    previous = ""
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        is_key = bool(re.match(r"^[a-z_]+\s*=", line))
        if is_key and not (previous.startswith("#") or re.match(r"^[a-z_]+\s*=", previous)):
            uncommented.append(line)
        previous = line
    assert not uncommented


def test_example_config_validates_with_its_placeholders_replaced(tmp_path):
    """With real paths in place of the placeholders the full check, paths included, passes."""
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "meta.json").write_text("{}")
    cfg = load_checked(EXAMPLE, [f'run.dir="{tmp_path / "run"}"', f'run.scratch="{tmp_path / "scratch"}"',
                                 f'run.remote="{tmp_path / "nfs"}"', f'data.prepared="{prepared}"'])
    assert cfg.run.name == "pretrain-768x8" and cfg.data.prepared == str(prepared)


@pytest.mark.slow
def test_minilmd_run_check_accepts_the_example_and_names_a_placeholder_it_cannot_use(tmp_path):
    """`minilmd run --check` (validate only) on the example, as the README tells a new operator to run it."""
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "meta.json").write_text("{}")
    placeholders_replaced = ["--set", f'run.dir="{tmp_path / "run"}"', "--set", f'run.scratch="{tmp_path / "s"}"',
                             "--set", f'run.remote="{tmp_path / "nfs"}"']
    command = [sys.executable, "-m", "minilmd.cli", "run", "--check", str(EXAMPLE), *placeholders_replaced]
    ok = subprocess.run([*command, "--set", f'data.prepared="{prepared}"'], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # the untouched NFS placeholder for the corpus is refused, by name
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "data.prepared" in refused.stdout + refused.stderr
