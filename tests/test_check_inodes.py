"""`minilmd run --check` and the launch's room check (daemon/jobs/scratch_room.py run_space_problem) count inodes as
staging does (inode_problem: the corpus's files and meta.json, and START_INODES for the trainer's start). Before,
they counted bytes alone: `--check` passed a scratch with no inode left (a tmpfs of few inodes, another user's
empty files), and staging then waited, or could never start. A real tmpfs of few inodes holds run.scratch."""
from __future__ import annotations

import errno

from minilmd.config import load_config
from minilmd.daemon.jobs import scratch_room
from supervisor_helpers import write_config


def _need(tmp_path, corpus) -> scratch_room.SpaceNeed:
    need = scratch_room.run_space_need(load_config(write_config(tmp_path, corpus, name="plain", remote=False)))
    assert need is not None and need.inodes >= 2  # at least a corpus file and meta.json
    return need


def test_a_scratch_with_fewer_inodes_in_all_than_staging_and_the_start_need_is_refused(tmp_path, corpus,
                                                                                      small_tmpfs):
    need = _need(tmp_path, corpus)
    disk = small_tmpfs(need.total + 16 * scratch_room.MIB, f"nr_inodes={need.inodes + 8},mode=0755")
    cfg = load_config(write_config(tmp_path, corpus, remote=False, run={"scratch": str(disk / "s")}))
    waits: list[str] = []
    refused = scratch_room.run_space_problem(cfg, waits)
    assert len(refused) == 1 and not waits, (refused, waits)
    assert f"needs {need.inodes + scratch_room.START_INODES:,} inodes ({need.inodes:,} for the corpus files to copy" \
        in refused[0] and "set run.scratch to a directory with more" in refused[0], refused


def test_a_scratch_whose_inodes_others_hold_now_is_a_wait_not_a_refusal(tmp_path, corpus, small_tmpfs):
    need = _need(tmp_path, corpus)
    disk = small_tmpfs(need.total + 16 * scratch_room.MIB, "nr_inodes=256,mode=0755")
    cfg = load_config(write_config(tmp_path, corpus, remote=False, run={"scratch": str(disk / "s")}))
    assert scratch_room.run_space_problem(cfg) == []  # room, bytes and inodes
    taken = 0
    while True:  # another user's empty files take every inode
        try:
            (disk / f"taken{taken}").touch()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            break
        taken += 1
    waits: list[str] = []
    assert scratch_room.run_space_problem(cfg, waits) == []
    assert len(waits) == 1 and "inodes" in waits[0] and "the run waits for room" in waits[0], waits
