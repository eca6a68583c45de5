"""A run.dir's record of the private scratch root that is there but cannot be read (EIO on a flaky NFS run.dir,
here a FUSE mount failing its reads) never leads to the default root another user made (review 8, finding 3).
Before, any read error counted as "no record": the path fell back to `<base>/minilmd-<uid>/<run>`, his directory,
and the trainer, which worked the path out again itself, trained and saved there. Now a read error is an error
(scratch_root.RecordUnreadable), the root settled at launch is carried in the supervisor's config (no read again),
and every attempt's command names the scratch (`run.scratch`), so a trainer never works it out from the record.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from faults_fixtures import faultfs  # noqa: F401 - fixture
from minilmd import scratch_root
from minilmd.checkpoint_select import RunDirUnusable, run_roots
from minilmd.config_sections import RunConfig
from minilmd.daemon.child.trainerwatch import attempt_command
from minilmd.daemon.preflight import ScratchRootUnknown
from minilmd.names import CHECKPOINTS, RUN_CONFIG_COPY, SCRATCH_BASE_ENV, SCRATCH_ROOT_RECORD

UID = os.geteuid()


@pytest.fixture
def squatted(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(base, the default root): base a stand-in for /dev/shm (1777), the default root's name taken by a file (no
    second user needed: tests/test_scratch_squat.py has another user's directory)."""
    base = tmp_path / "shm"
    base.mkdir()
    base.chmod(0o1777)
    monkeypatch.setenv(SCRATCH_BASE_ENV, str(base))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    default = base / f"minilmd-{UID}"
    default.write_text("his")
    return base, default


def config_of(run_dir: Path) -> RunConfig:
    cfg = RunConfig()
    cfg.run.name, cfg.run.dir = "r", str(run_dir)
    return cfg


def test_an_unreadable_record_is_an_error_and_never_the_squatted_default(faultfs, squatted):
    _, default = squatted
    run_dir = faultfs.root / "run"
    run_dir.mkdir()
    own, said = scratch_root.settle(run_dir)
    assert said and own.parent != default and scratch_root.recorded(run_dir) == own
    settled = config_of(run_dir)
    settled.fix_scratch_root(own)  # what the launch does (daemon/preflight.py)
    (run_dir / RUN_CONFIG_COPY).write_text(f'[run]\nname = "r"\ndir = "{run_dir}"\n'
                                           f'[data]\nprepared = "{run_dir}"\n[train]\nmax_steps = 1\n')
    assert run_roots(run_dir).roots[0] == own / "r" / CHECKPOINTS  # status, sample, export: the record read

    faultfs.fail_reads(SCRATCH_ROOT_RECORD)  # the record is there, its reads fail with EIO
    with pytest.raises(scratch_root.RecordUnreadable):
        scratch_root.recorded(run_dir)
    assert faultfs.hits("error")  # the fault was really met
    with pytest.raises(scratch_root.RecordUnreadable):
        _ = config_of(run_dir).scratch_dir  # a command that reads it (status, a launch's checks): told, not moved
    with pytest.raises(scratch_root.RecordUnreadable):
        scratch_root.settle(run_dir)  # a launch now: no root decided, nothing made in the default's place
    with pytest.raises(RunDirUnusable, match="cannot be known now"):
        run_roots(run_dir)  # `status`, `sample RUN_DIR`: said, never his checkpoints
    assert settled.scratch_dir == own / "r" and settled.checkpoint_dir.parent == own / "r"  # carried, not read
    assert not default.is_dir() and default.read_text() == "his"

    # the trainer is told the scratch; what it makes of its --set reads nothing either
    command = attempt_command(run_dir, run_dir / "staged", settled.scratch_dir, {}, {}, nproc=1)
    assert f'run.scratch="{own / "r"}"' in command
    trainer = config_of(run_dir)
    trainer.override("run.scratch", str(own / "r"))
    assert trainer.scratch_dir == own / "r" and trainer.scratch_is_default  # a default's rules: its root private


def test_a_launch_that_cannot_read_the_record_ends_said_to_be_started_again(capsys):
    """exit 1 (not 2, final): systemd starts it again; the words say the default root was not used."""
    ends = ScratchRootUnknown(scratch_root.RecordUnreadable("run/scratch-root.json: EIO"))
    assert ends.exit_status == 1
    out = capsys.readouterr().out
    assert "nothing started" in out and "default scratch root is not used instead" in out


def test_a_missing_record_is_none_and_a_free_default_serves(tmp_path, monkeypatch):
    base = tmp_path / "shm"
    base.mkdir()
    base.chmod(0o1777)
    monkeypatch.setenv(SCRATCH_BASE_ENV, str(base))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert scratch_root.recorded(run_dir) is None  # ENOENT alone is "no record"
    assert config_of(run_dir).scratch_dir == base / f"minilmd-{UID}" / "r"


def test_a_command_never_looks_for_checkpoints_in_a_squatted_default_root(squatted, tmp_path):
    """No record (removed by hand, or never written by an older launch) and the default root another's: `status`,
    `sample RUN_DIR` and `export RUN_DIR` are told, never given his directory's checkpoints."""
    _, default = squatted
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RUN_CONFIG_COPY).write_text(f'[run]\nname = "r"\ndir = "{run_dir}"\n'
                                           f'[data]\nprepared = "{run_dir}"\n[train]\nmax_steps = 1\n')
    with pytest.raises(RunDirUnusable, match=f"its scratch is not looked in: {default} is a file"):
        run_roots(run_dir)
    default.unlink()
    default.mkdir(mode=0o700)  # ours again
    assert run_roots(run_dir).roots[0] == default / "r" / CHECKPOINTS
