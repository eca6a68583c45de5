"""Another user who makes torch inductor's default cache directory, `/tmp/torchinductor_<user>` (and its
two-letter subdirectories, 0777), before a user's first compile can later swap the kernels there for his own, and
the user's next cache hit runs them. No process minilmd starts compiles there: `minilmd train` on its own uses its
run's `<scratch>/compile-cache/` as the supervisor does, a bench a fresh private directory removed after, and a
cache variable set to a place someone else can write is not used (minilmd/compile_cache.py).

The real trainer and bench run with torch.compile's backend replaced by one that asks torch, when it compiles,
where inductor would cache (tests/compile_cache_probe.py): a real inductor build takes minutes on 2 CPUs. Each test
gives its process a user name of its own (USER, LOGNAME: what torch names the directory after), so no real cache is
touched.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd.compile_cache import root_of
from minilmd.config import load_config
from minilmd.daemon.child import process as childmod
from minilmd.names import COMPILE_CACHE
from second_user import second_user, sh_as_user
from trainer_corpus import child_env, write_config

PROBE = Path(__file__).resolve().parent / "compile_cache_probe.py"
PRINT_CACHES = [sys.executable, "-c", "import os, tempfile; print('caches', os.environ['TORCHINDUCTOR_CACHE_DIR'], "
                                      "os.environ['TRITON_CACHE_DIR'], tempfile.gettempdir())"]
TINY = ["model.hidden_size=16", "model.num_hidden_layers=1", "model.num_attention_heads=2",
        "model.num_key_value_heads=1", "model.vocab_size=64", "train.seq_len=16", "train.micro_batch_size=1",
        "train.device=\"cpu\""]


@pytest.fixture
def planted():
    """(the victim's user name, the inductor cache directory the second user made first for that name in /tmp)."""
    second_user()
    name = f"minilmd-victim-{secrets.token_hex(6)}"
    where = Path("/tmp") / f"torchinductor_{name}"
    sh_as_user(f"mkdir -m 0777 {where} {where}/aa {where}/bb {where}/cc", "/tmp")
    try:
        yield name, where
    finally:
        shutil.rmtree(where)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def victim_env(name: str, **extra) -> dict:
    """The victim's environment: his user name, TMPDIR the usual /tmp, no cache variable of his own."""
    env = child_env(USER=name, LOGNAME=name, TMPDIR="/tmp", **extra)
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(var, None)
    return env


def caches_seen(output: str) -> list[dict]:
    seen = [json.loads(line.split("compile caches ", 1)[1]) for line in output.splitlines()
            if line.startswith("compile caches ")]
    assert seen, output[-3000:]
    return seen


def assert_not_planted(seen: list[dict], planted: Path) -> None:
    for paths in seen:
        for what, path in paths.items():
            assert not Path(os.path.realpath(path)).is_relative_to(planted), \
                f"{what} {path} is the directory another user made"


def assert_inside(seen: list[dict], root: Path) -> None:
    for paths in seen:
        for what, path in paths.items():
            assert Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root)), \
                f"{what} {path} is not under {root}"


@pytest.mark.slow
def test_the_standalone_trainer_never_compiles_into_a_cache_another_user_made_first(tmp_path, corpus, planted):
    name, where = planted
    before = listing(where)
    config = write_config(tmp_path, corpus, train={"compile": True, "max_steps": 2, "micro_batch_size": 1,
                                                   "grad_accum": 1, "seq_len": 16, "checkpoint_every": 100})
    done = subprocess.run([sys.executable, str(PROBE), "train", str(config)], capture_output=True, text=True,
                          timeout=300, env=victim_env(name))
    assert done.returncode == 0, done.stderr[-3000:]
    root = root_of(load_config(config).scratch_dir)
    seen = caches_seen(done.stdout)
    assert_not_planted(seen, where)
    assert_inside(seen, root)  # the run's own, as under the supervisor
    assert listing(where) == before  # nothing of the victim's written there
    assert "TMPDIR=" in done.stdout and "is not used" in done.stdout  # /tmp is root's: inductor's name in it is not


@pytest.mark.slow
def test_bench_step_compiles_in_a_private_cache_removed_after(tmp_path, planted):
    name, where = planted
    before = listing(where)
    done = subprocess.run([sys.executable, str(PROBE), "bench", "step", "--steps", "1", "--modes", "eager,compiled",
                           *[a for s in TINY for a in ("--set", s)]], capture_output=True, text=True, timeout=300,
                          env=victim_env(name), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = caches_seen(done.stdout)
    assert_not_planted(seen, where)
    private = Path(seen[0]["cache_dir"]).parent
    assert private.name.startswith("minilmd-compile-cache-"), seen
    assert_inside(seen, private)
    assert not private.exists()  # removed after
    assert listing(where) == before


def test_a_cache_variable_naming_another_users_directory_is_not_used_by_the_supervisors_trainer(
        tmp_path, planted, monkeypatch):
    name, where = planted
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(where))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(where / "aa"))
    monkeypatch.setenv("TMPDIR", "/tmp")
    root = tmp_path / "scratch" / COMPILE_CACHE
    child = childmod.launch(PRINT_CACHES, tmp_path, 1, "", compile_cache=root)
    assert child.popen.wait(timeout=30) == 0
    log = child.log_path.read_text()
    assert f"\ncaches {root / 'inductor'} {root / 'triton'} {root / 'tmp'}\n" in log, log
    assert f"the TORCHINDUCTOR_CACHE_DIR set for the supervisor is not used: TORCHINDUCTOR_CACHE_DIR {where}" in log
    assert f"# TMPDIR={root / 'tmp'} (the run's own, under scratch; the TMPDIR set for the supervisor is not " \
           f"used: " in log
    assert listing(where) == ["aa", "bb", "cc"]


def test_a_slurm_nodes_trainer_gets_the_caches_the_supervisor_chose_made_on_that_node(tmp_path, corpus):
    """The supervisor chose the run's own caches on its node; on another node nothing has made them yet, and a
    TMPDIR that does not exist is passed over by Python for /tmp, where inductor's default cache is anyone's."""
    node_scratch = tmp_path / "node" / "scratch"
    root = node_scratch / COMPILE_CACHE
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton"),
           "TMPDIR": str(root / "tmp")}
    done = subprocess.run([sys.executable, "-m", "minilmd.daemon.slurm.node", "--scratch", str(node_scratch),
                           "--source", str(corpus[0]), "--run-dir", str(tmp_path / "run"), "--run-name", "n", "--",
                           *PRINT_CACHES], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"caches {root / 'inductor'} {root / 'triton'} {root / 'tmp'}" in done.stdout.splitlines()[-1]
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o700
