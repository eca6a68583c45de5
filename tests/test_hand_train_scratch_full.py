"""`minilmd train` on its own (no supervisor) on a scratch with no room left: no bytes, or no inodes (a real tmpfs
holds run.scratch). It claims scratch and makes its compile caches there itself (trainer/loop/entry.py
claim_on_its_own); before, ENOSPC there was an OSError traceback (exit 1) and left an empty, half-claimed scratch.
Now: one line saying what is used up, exit 74 (protocol.EXIT_SCRATCH_FULL), nothing it made left behind."""
from __future__ import annotations

import errno

import pytest

from filling import fill
from minilmd import protocol
from minilmd.names import RUN_DIR_ENV
from minilmd.trainer.loop import entry
from supervisor_helpers import write_config


def take_every_inode(disk) -> list[str]:
    made = []
    while True:
        try:
            (disk / f"taken{len(made)}").touch()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            return made
        made.append(f"taken{len(made)}")


@pytest.mark.parametrize("used_up", ["bytes", "inodes"])
def test_a_hand_train_on_a_full_scratch_says_so_in_one_line_exits_74_and_leaves_nothing(tmp_path, corpus,
                                                                                      small_tmpfs, capsys,
                                                                                      monkeypatch, used_up):
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)  # on its own: no supervisor
    if used_up == "bytes":
        disk = small_tmpfs("256k")
        fillers = [fill(disk).name]
    else:
        disk = small_tmpfs("4m", "nr_inodes=16,mode=0755")
        fillers = take_every_inode(disk)
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": str(disk / "scratch")})
    rc = entry.main(str(config))
    err = capsys.readouterr().err
    assert rc == protocol.EXIT_SCRATCH_FULL, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"minilmd train: scratch full: run.scratch {disk / 'scratch'} "
                                                   f"cannot be made ready: No space left on device"), err
    assert "Traceback" not in err, err
    assert sorted(p.name for p in disk.iterdir()) == sorted(fillers)  # no scratch, no compile cache left

