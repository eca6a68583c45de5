"""A remote out of inodes is said as one: "no inode left", not bytes it has to spare.

Observed before (reports fault8 F3): a tmpfs remote of 20 MiB with 30 inodes, filled with empty files, was reported
"remote full (needs 0.4 MB, free 21.0 MB)": a message that contradicts itself and sends the operator to free bytes,
which would not help. The wait itself was right (the run finished once files were removed). The rule of what ran out
is fsio.no_inode_left, the one the scratch wait and `prepare` use too. A real tmpfs mounted with nr_inodes.
"""
from __future__ import annotations

import errno
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs
from minilmd.config import load_config
from supervisor_helpers import cli, start_supervisor, state, wait_for, wait_or_kill, write_config


def fill_inodes_leaving(disk: Path, left: int) -> list[Path]:
    """Another user's empty files on the tmpfs until `left` inodes are free (bytes stay plenty)."""
    made: list[Path] = []
    while True:
        path = disk / f"other-{len(made)}"
        try:
            path.touch()
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            break
        made.append(path)
    for path in made[len(made) - left:]:
        path.unlink()
    return made[:len(made) - left]


@pytest.mark.slow
def test_a_remote_out_of_inodes_says_inodes_and_the_run_finishes_once_some_are_freed(tmp_path, corpus, small_tmpfs):
    disk = small_tmpfs("64m", "nr_inodes=64,mode=0755")
    remote = disk / "remote"
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote)}, sync={"every": "2s"})
    cfg = load_config(config)
    remote.mkdir()
    fillers = fill_inodes_leaving(disk, 1)  # room for the claim, not for a checkpoint
    sup = start_supervisor(config, tmp_path / "sup.out")
    try:
        wait_for(lambda: "final sync waiting" in (state(cfg.run_dir).get("reason") or "") or sup.poll() is not None,
                 180, "the last sync to wait for room")
        assert sup.poll() is None, (tmp_path / "sup.out").read_text()[-3000:]
        reason = state(cfg.run_dir)["reason"]
        assert "final sync waiting: remote full: no inode left for a new file (64 in all; " in reason, reason
        assert "needs" not in reason, reason
        text = cli("status", str(cfg.run_dir)).stdout
        assert "no inode left" in text, text
        for path in fillers:
            path.unlink()
        assert wait_or_kill(sup, 180) == 0, (tmp_path / "sup.out").read_text()[-3000:]
    finally:
        if sup.poll() is None:
            sup.kill()
    assert state(cfg.run_dir)["phase"] == "done"
    assert checkpoint_dirs.read_latest(remote) == "step-00000030"
