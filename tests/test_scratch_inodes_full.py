"""Another user uses up the inodes of the scratch base (/dev/shm; here a real tmpfs of 64 inodes) with empty files
before a launch: making the scratch root fails with ENOSPC though bytes are free. Before, that was exit 2, final for
systemd and the tmux launcher: his files ended an unattended run for good (hostile audit 7 F2), where a base full by
bytes made the launch wait. Now it is the same wait (fsio.is_disk_full, the one rule): said once, naming the inodes,
then tried again with the restart backoff until there is room. The attacker's files are a real uid's (64123, no
passwd entry), chowned by the test (root); skipped where a tmpfs cannot be mounted.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from minilmd import names, scratch_root
from minilmd.daemon import preflight
from supervisor_helpers import write_config
from tmpfs_helpers import OTHER, UID, base, fill_inodes  # noqa: F401 - base: the tmpfs fixture


def launch_waiting(config: Path, files: list[Path], monkeypatch, capsys) -> tuple[object, list[str]]:
    """preflight.launch, its wait's sleep faked: at the first, what the launch said so far is kept, then his files
    are removed (an admin, or he, frees the inodes)."""
    said: list[str] = []

    def room_again(wait: float) -> None:
        said.append(capsys.readouterr().out)
        for path in files:
            path.unlink(missing_ok=True)

    if (claim := getattr(preflight, "claim_scratch", None)) is not None:  # before: no wait, ConfigError (exit 2)
        monkeypatch.setattr(preflight, "claim_scratch", functools.partial(claim, sleep=room_again))
    cfg, _, held = preflight.launch(str(config))
    if held is not None:  # the run lock and the signal handlers the wait hands a supervisor: none starts here
        held.give_back()
    return cfg, said + [capsys.readouterr().out]


def test_a_base_whose_inodes_another_user_used_up_is_waited_for_never_exit_2(base, tmp_path, corpus, monkeypatch,
                                                                             capsys):
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""})
    files = fill_inodes(base)
    cfg, said = launch_waiting(config, files, monkeypatch, capsys)
    assert "waits:" in said[0] and "no inode left" in said[0] and "not a failure" in said[0], said
    assert cfg.scratch_dir == base / f"minilmd-{UID}" / "s" and (cfg.scratch_dir / names.SCRATCH_OWNER).is_file()
    assert "room again" in said[-1], said


def test_a_squatted_default_root_with_no_inode_left_for_a_private_one_is_waited_for_too(base, tmp_path, corpus,
                                                                                       monkeypatch, capsys):
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": ""})
    squat = base / f"minilmd-{UID}"
    squat.mkdir()
    os.chown(squat, OTHER, OTHER)
    files = fill_inodes(base)
    cfg, said = launch_waiting(config, files, monkeypatch, capsys)
    assert "a private one cannot be made now" in said[0] and "no inode left" in said[0], said
    private = cfg.scratch_dir.parent
    assert private != squat and scratch_root.recorded(cfg.run_dir) == private and cfg.scratch_dir.is_dir()
