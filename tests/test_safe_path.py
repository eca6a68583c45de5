"""No Python that minilmd starts imports a module another user planted in the directory it was started from.

`python -m` (and `python -c`) put the working directory first on sys.path. The attack: another user leaves
`minilmd/__init__.py` (or `multiprocessing/`) in a shared directory; whoever starts `minilmd run` (or `prepare`)
there ran her code as himself, in every trainer, torchrun rank or worker. minilmd/pychild.py is the rule; these
tests start the real commands as root from such a directory made by a second user and look for her marker.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from deploy_helpers import launcher, launcher_config  # noqa: F401  (a fixture)
from minilmd import names, pychild
from minilmd.config import given_sets, load_config
from minilmd.daemon.child import process as childmod
from minilmd.daemon.child.trainerwatch import attempt_command
from second_user import sh_as_user, teammate  # noqa: F401  (a fixture)
from supervisor_helpers import env_for, state, wait_or_kill, write_config

MINILMD = Path(sys.executable).with_name("minilmd")
"""The console script, as a person starts it: its own sys.path[0] is the venv's bin/, never the working directory."""
MARK = "planted-code-ran"

PLANTED = """
import importlib, os, sys
with open(os.path.join({where!r}, {mark!r}), "a") as f:
    f.write(f"uid {{os.getuid()}} pid {{os.getpid()}}: {{sys.argv}}\\n")
# then the real package, so that a run with the hole still finishes: the marker alone tells
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != {where!r}]
del sys.modules[__name__]
sys.modules[__name__] = importlib.import_module(__name__)
"""


def plant(where: Path, package: str) -> None:
    """`package/__init__.py` in `where`, made by the second user, that writes MARK there whenever it is imported;
    checked to work: a plain `python -c "import PACKAGE"` started there runs it (what each test must prevent)."""
    code = PLANTED.format(where=str(where), mark=MARK)
    sh_as_user(f"mkdir {package} && cat > {package}/__init__.py <<'EOF'\n{code}\nEOF", cwd=where)
    assert (where / package / "__init__.py").stat().st_uid != os.getuid()
    env = {k: v for k, v in os.environ.items() if k != pychild.SAFE_PATH_ENV}
    subprocess.run([sys.executable, "-c", f"import {package}"], cwd=where, env=env, check=True, timeout=120)
    assert f"uid {os.getuid()}" in marks(where), "the planted package was not imported: the test would prove nothing"
    (where / MARK).unlink()


def marks(where: Path) -> str:
    path = where / MARK
    return path.read_text() if path.exists() else ""


def test_a_trainer_starts_in_root_with_no_unsafe_directory_on_its_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = "import os, sys; print('cwd', os.getcwd(), 'path0', sys.path[0], 'env', os.environ.get('PYTHONSAFEPATH'))"
    child = childmod.launch([*pychild.python_argv("-c", code)], tmp_path / "run", 1, devices="")
    assert child.popen.wait(60) == 0
    line = [ln for ln in child.log_path.read_text().splitlines() if ln.startswith("cwd ")][-1]
    cwd, path0, env = line.split()[1], line.split()[3], line.split()[5]
    assert cwd == pychild.CHILD_CWD and env == "1"
    assert path0 not in ("", str(tmp_path))  # on 3.11+ no directory is prepended; on 3.10 it is "/"


def test_a_relative_set_path_names_the_place_it_named_for_the_supervisor(tmp_path, monkeypatch):
    """The trainer runs in "/": a `--set init.from=rel` typed in a shell must still name the shell's rel."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(childmod.TRAINER_CMD_ENV, raising=False)
    command = attempt_command(tmp_path / "run", tmp_path / "staged", tmp_path / "scratch", {},
                              given_sets(["init.from=teammate/ckpt"]), nproc=1)
    assert f'init.from="{tmp_path / "teammate" / "ckpt"}"' in command


@pytest.mark.slow
def test_minilmd_run_from_a_planted_directory_runs_none_of_her_code_and_finishes(tmp_path, corpus,
                                                                                 teammate):
    _, where = teammate
    plant(where, "minilmd")
    config = write_config(tmp_path, corpus, remote=False,
                          train={"max_steps": 2, "checkpoint_every": 2, "micro_batch_size": 2, "grad_accum": 1})
    out = open(tmp_path / "supervisor.out", "ab")
    sup = subprocess.Popen([str(MINILMD), "run", str(config)], cwd=where, stdout=out, stderr=subprocess.STDOUT,
                           env=env_for(fake=False))
    assert wait_or_kill(sup, 300) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    cfg = load_config(config)
    assert state(cfg.run_dir)["phase"] == "done"
    assert marks(where) == ""
    header = (cfg.run_dir / names.ATTEMPT_LOGS / names.attempt_log_name(1)).read_text().splitlines()[0]
    assert header.startswith(f"# attempt 1: {shlex.join(pychild.module_argv('minilmd.cli', 'train'))} "), header


@pytest.mark.slow
def test_torchrun_ranks_started_from_a_planted_directory_run_none_of_her_code(tmp_path, teammate,
                                                                             monkeypatch):
    """torchrun starts each rank as `sys.executable -u -m minilmd.cli`, a command minilmd does not build: the
    rank is guarded by what it inherits (PYTHONSAFEPATH=1, the working directory "/")."""
    _, where = teammate
    plant(where, "minilmd")
    monkeypatch.chdir(where)
    monkeypatch.delenv(childmod.TRAINER_CMD_ENV, raising=False)
    missing = tmp_path / "no-such-config.toml"  # each rank imports minilmd.cli, then refuses it: exit 2
    command = childmod.build_command(missing, {}, nproc=2)
    child = childmod.launch(command, tmp_path / "run", 1, devices="", extra_env={"OMP_NUM_THREADS": "1"})
    assert child.popen.wait(300) != 0
    log = child.log_path.read_text()
    # a rank ran the real minilmd.cli; the other may be stopped by torchrun first (the config is refused before torch
    # is imported: the first rank to refuse ends the group), but none ran her code
    assert f"no such file: {missing}" in log, log[-3000:]
    assert marks(where) == ""


@pytest.mark.slow
def test_prepare_workers_spawned_from_a_planted_directory_run_none_of_her_code(tmp_path, teammate, tokenizer,
                                                                              demo_jsonl):
    """multiprocessing's spawn starts `python -c ...` in the working directory: prepare's workers imported a
    planted `multiprocessing/` (`minilmd` sets PYTHONSAFEPATH=1 for all it starts: pychild.guard_descendants)."""
    if not pychild.SAFE_PATH_FLAGS:
        pytest.skip("Python 3.10 has no safe path: spawn's `-c` puts the working directory first")
    _, where = teammate
    plant(where, "multiprocessing")
    out = tmp_path / "prepared"
    done = subprocess.run([str(MINILMD), "prepare", demo_jsonl[0], "--tokenizer", str(tokenizer), "--out", str(out),
                           "--workers", "2", "--val-fraction", "0.05"], cwd=where, capture_output=True, text=True,
                          timeout=300, env=env_for(fake=False))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (out / names.CORPUS_META).exists()
    assert marks(where) == ""



@pytest.mark.slow
def test_the_tmux_launcher_started_from_a_planted_directory_runs_none_of_her_code(launcher, teammate):
    """deploy/minilmd-tmux.sh reads run.name with `python -c`: a `tomllib/` planted where it is started from."""
    _, where = teammate
    plant(where, "tomllib")
    config = launcher_config(launcher.root / "demo.toml", "demo", str(launcher.root / "runs" / "demo"))
    started = launcher("--no-attach", str(config), cwd=where)
    assert started.returncode == 0, started.stderr
    assert "minilmd-demo: started window run" in started.stdout
    assert marks(where) == ""
