"""A run.scratch written out directly in the per-user default root (`<base>/minilmd-<uid>/NAME`, as the demo writes
its config, and every config copied from it) where another user made that root first (hostile audit 7 F4). Before,
exit 2 (`belongs to user ...`), final for systemd and the tmux launcher, where an unset run.scratch made a private
root and went on (hostile audit 6 F4). Now that root is settled as an unset run.scratch's (scratch_root
in_default_root): a private root, NAME kept in it, recorded in run.dir, where `status`/`sample` find it. A
run.scratch anywhere else is the user's choice and stays refused inside his directory. His directory is a real
uid's (64123, no passwd entry), chowned by the test (root).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minilmd import names, scratch_root
from minilmd.checkpoint_select import run_roots
from minilmd.config import ConfigError
from minilmd.daemon import preflight
from supervisor_helpers import write_config

OTHER = 64123
UID = os.geteuid()


@pytest.fixture
def squatted(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(base, the default root his): base a stand-in for /dev/shm (1777)."""
    if UID != 0:
        pytest.skip("needs root to make another user's directory")
    base = tmp_path / "shm"
    base.mkdir()
    base.chmod(0o1777)
    monkeypatch.setenv(names.SCRATCH_BASE_ENV, str(base))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv(names.RUN_DIR_ENV, raising=False)
    default = base / f"minilmd-{UID}"
    default.mkdir()
    os.chown(default, OTHER, OTHER)
    return base, default


def test_a_scratch_written_in_the_squatted_default_root_goes_to_a_private_root_kept_for_every_reader(
        squatted, tmp_path, corpus):
    base, default = squatted
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": str(default / "demo-1a2b3c4d")})
    cfg, _, _ = preflight.launch(str(config))  # before: ConfigError, `... belongs to uid 64123`
    private = cfg.scratch_dir.parent
    assert cfg.scratch_dir.name == "demo-1a2b3c4d" and private != default and private.parent == base
    assert scratch_root.recorded(cfg.run_dir) == private and (cfg.scratch_dir / names.SCRATCH_OWNER).is_file()
    assert os.listdir(default) == []  # nothing of the run in his directory
    (cfg.run_dir / names.RUN_CONFIG_COPY).write_text(config.read_text())  # what the supervisor copies there
    assert run_roots(cfg.run_dir).roots[0] == cfg.scratch_dir / names.CHECKPOINTS  # status, sample, export


def test_a_scratch_set_elsewhere_in_his_directory_stays_refused(squatted, tmp_path, corpus):
    """Only the per-user default root is settled: a path below another directory of his is the user's own choice,
    refused as before."""
    base, default = squatted
    (default / "mine").mkdir()
    os.chown(default / "mine", OTHER, OTHER)
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": str(default / "mine" / "s")})
    with pytest.raises(ConfigError, match=f"uid {OTHER}"):
        preflight.launch(str(config))
