"""One file permissions policy for everything a run and an export write (minilmd/perms.py, docs/operations.md "File
permissions"): private by default (0700/0600) under the usual umask 022, "group" 0750/0640, "all" 0755/0644, and
the umask only ever tightens it. Real processes: the supervisor with the fake trainer, then the real trainer
(TensorBoard, checkpoints, LoRA) and `minilmd export`; all of them are slow tests."""
from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from in_process import train_in_process
from minilmd import names
from minilmd.config import ConfigError, config_from_dict
from minilmd.lockfile import LOCK_FILE_MODE
from minilmd.names import COMPILE_CACHE
from supervisor_helpers import cli, run_supervisor, write_config

LOCK_FILES = {("run", names.LOCK), ("scratch", names.SCRATCH_OWNER), ("scratch", names.TRAINER_LOCK)}
"""The run's lock files: LOCK_FILE_MODE whatever run.share says (hostile10 F1, F2)."""
MODES = {"private": (0o700, 0o600), "group": (0o750, 0o640), "all": (0o755, 0o644)}
"""(directory mode, file mode) of each policy under umask 022 (docs/operations.md, "File permissions")."""


@contextlib.contextmanager
def umask(mask: int):
    """The test process's umask for the children it starts meanwhile (they inherit it)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def run_section(share: str) -> dict:
    """[run] keys beside write_config's: share only when it is not the default (the default is what is tested)."""
    return {"keep_scratch": True, **({"share": share} if share != "private" else {})}


def modes_below(base: Path, *tops: Path) -> dict[str, int]:
    """{path relative to base: permission bits} of every file and directory below each top (the top itself
    included), links not followed."""
    found = {}
    for top in tops:
        found[str(top.relative_to(base)) or "."] = stat.S_IMODE(os.lstat(top).st_mode)
        for where, dirs, files in os.walk(top):
            for name in dirs + files:
                path = Path(where) / name
                found[str(path.relative_to(base))] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def wrong_modes(found: dict[str, int], dir_mode: int, file_mode: int, base: Path,
                always_private: tuple[str, ...] = ()) -> list[str]:
    """Every entry whose mode is not the policy's ("path 0644, expected 0600"); names in always_private are 0700
    whatever the policy (scratch: nobody else may list or enter it), and so are the directories of the run's compile
    caches (minilmd/compile_cache.py: the kernels the trainer loads and its TMPDIR, the user's alone); lock files are
    0600 whatever the policy (minilmd/lockfile.py LOCK_FILE_MODE: whoever can open one can hold its lock)."""
    wrong = []
    for rel, mode in sorted(found.items()):
        is_dir = (base / rel).is_dir()
        in_cache = is_dir and COMPILE_CACHE in Path(rel).parts[:-1]
        expected = 0o700 if rel in always_private or in_cache else dir_mode if is_dir else \
            LOCK_FILE_MODE if Path(rel).parts[-2:] in LOCK_FILES else file_mode
        if mode != expected:
            wrong.append(f"{rel} {mode:04o}, expected {expected:04o}")
    return wrong


def assert_names_cover(found: dict[str, int], *parts: str) -> None:
    """The run wrote what the assertions are about: a check over nothing cannot pass."""
    for part in parts:
        assert any(part in rel for rel in found), (part, sorted(found))


# --- the config key and the flag ---------------------------------------------------------------------------------

def test_run_share_is_a_checked_config_key_private_by_default():
    cfg = config_from_dict({"run": {"name": "x", "dir": "/tmp/x"}, "data": {"prepared": "/tmp/p"},
                            "train": {"max_steps": 1}})
    assert cfg.run.share == "private"
    with pytest.raises(ConfigError) as e:
        config_from_dict({"run": {"name": "x", "dir": "/tmp/x", "share": "world"}, "data": {"prepared": "/tmp/p"},
                          "train": {"max_steps": 1}})
    assert "run.share = 'world': must be \"private\", \"group\" or \"all\"" in str(e.value)


def test_export_refuses_a_share_that_is_not_a_policy(tmp_path):
    out = cli("export", str(tmp_path), "--format", "hf", "--out", str(tmp_path / "hf"), "--share", "world",
              fake=False)
    assert out.returncode == 2 and "--share = 'world'" in out.stderr
    assert not (tmp_path / "hf").exists()


def test_the_umask_only_ever_tightens_the_policy(tmp_path):
    """apply() in a process of its own (it sets the process umask): "all" under 027 stays 0750/0640; "private"
    under 002 is 0700/0600; atomic_write_text follows it."""
    script = ("import os, sys; from minilmd import perms; from minilmd.fsio import atomic_write_text\n"
              "os.umask(int(sys.argv[1], 8)); perms.apply(sys.argv[2]); d = sys.argv[3]; os.mkdir(d)\n"
              "atomic_write_text(d + '/a', 'x'); open(d + '/b', 'w').close()\n"
              "print(' '.join(oct(os.stat(p).st_mode & 0o777) for p in (d, d + '/a', d + '/b')))\n")
    for mask, share, expected in (("027", "all", "0o750 0o640 0o640"), ("002", "private", "0o700 0o600 0o600"),
                                  ("022", "group", "0o750 0o640 0o640"), ("022", "all", "0o755 0o644 0o644")):
        out = subprocess.run([sys.executable, "-c", script, mask, share, str(tmp_path / f"{share}-{mask}")],
                             capture_output=True, text=True, check=True)
        assert out.stdout.split() == expected.split(), (mask, share, out.stderr)


# --- a supervised run, the fake trainer: what the supervisor and the sync write ----------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("share", ["private", "group"])
def test_what_a_supervised_run_writes_follows_run_share_under_umask_022(tmp_path, corpus, share):
    config = write_config(tmp_path, corpus, name="p", run=run_section(share),
                          early_stop={"patience": 50}, train={"eval_every": 10})
    with umask(0o022):
        assert run_supervisor(config, tmp_path) == 0
    root = tmp_path / "p"
    found = modes_below(root, root / "run", root / "scratch", root / "remote")
    assert_names_cover(found, "run/state.json", "run/events.jsonl", "run/supervisor.log", "run/logs/attempt-",
                       "run/metrics.jsonl", "run/heartbeat", "run/run.toml", "remote/LATEST", "remote/step-",
                       "scratch/checkpoints/LATEST", "scratch/corpus/meta.json")
    dir_mode, file_mode = MODES[share]
    assert not wrong_modes(found, dir_mode, file_mode, root, always_private=("scratch",))


# --- the real trainer (TensorBoard, its checkpoints, LoRA) and the exports ---------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("share", ["private", "group"])
def test_a_real_run_its_lora_stage_and_their_exports_follow_the_policy_under_umask_022(tmp_path, corpus, share):
    config = write_config(tmp_path, corpus, name="s", run=run_section(share),
                          train={"max_steps": 8, "checkpoint_every": 4, "eval_every": 2},
                          early_stop={"patience": 50}, log={"tensorboard": True})
    lora = write_config(tmp_path, corpus, name="l", remote=False, run=run_section(share),
                        train={"max_steps": 4, "checkpoint_every": 4}, init={"from": str(tmp_path / "s" / "remote")},
                        lora={"rank": 4})
    exports = tmp_path / "exports"
    with umask(0o022):
        assert run_supervisor(config, tmp_path, timeout=600, fake=False) == 0
        trained = train_in_process(lora)  # the test's process, its umask (tests/in_process.py)
        assert trained.returncode == 0, trained.stderr[-2000:]
        for fmt, source, out in (("minimind", "s/remote", "m.pth"), ("hf", "s/remote/BEST", "hf"),
                                 ("peft", "l/scratch/checkpoints", "peft")):
            done = cli("export", str(tmp_path / source), "--format", fmt, "--out", str(exports / out),
                       *(["--share", share] if share != "private" else []), timeout=300, fake=False)
            assert done.returncode == 0, done.stderr[-2000:]
    found = modes_below(tmp_path, tmp_path / "s" / "run", tmp_path / "s" / "scratch", tmp_path / "s" / "remote",
                        tmp_path / "l" / "run", tmp_path / "l" / "scratch", exports)
    assert_names_cover(found, "s/run/tensorboard/events.out.tfevents", "s/remote/BEST", "s/remote/LATEST",
                       "s/scratch/checkpoints/BEST", "model.safetensors", "l/scratch/checkpoints/LATEST",
                       "exports/m.pth", "exports/hf/model.safetensors", "exports/peft/adapter_model.safetensors")
    dir_mode, file_mode = MODES[share]
    assert not wrong_modes(found, dir_mode, file_mode, tmp_path, always_private=("s/scratch", "l/scratch"))


@pytest.mark.slow
def test_an_export_shared_with_all_is_only_as_open_as_the_umask_lets_it(tmp_path, corpus):
    config = write_config(tmp_path, corpus, name="a", remote=False, train={"max_steps": 2, "checkpoint_every": 2})
    assert train_in_process(config).returncode == 0  # the test's process (tests/in_process.py)
    checkpoints = tmp_path / "a" / "scratch" / "checkpoints"
    for mask, out, expected in ((0o022, "open", (0o755, 0o644)), (0o027, "group-only", (0o750, 0o640))):
        with umask(mask):
            done = cli("export", str(checkpoints), "--format", "hf", "--out", str(tmp_path / out / "hf"),
                       "--share", "all", timeout=300, fake=False)
        assert done.returncode == 0, done.stderr[-2000:]
        found = modes_below(tmp_path, tmp_path / out)
        assert_names_cover(found, "hf/model.safetensors", "hf/config.json")
        assert not wrong_modes(found, *expected, tmp_path)
