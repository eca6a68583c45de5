"""The trainer's heartbeat is written as every small file of the run is (fsio.atomic_write_text): a temp name made
new (O_EXCL) that no one can guess. Before, it was `.heartbeat.PID.tmp`, written by write_text through whatever was
there: a link planted at that name by another user of a shared run directory made the trainer write into the
file the link names."""
from __future__ import annotations

import os

from minilmd.metrics import MetricsLog
from minilmd.names import HEARTBEAT


def test_a_link_planted_at_the_old_temp_name_is_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    planted = run / f".{HEARTBEAT}.{os.getpid()}.tmp"
    planted.symlink_to(victim)
    log = MetricsLog(run)
    assert log.heartbeat(5, force=True) and log.heartbeat(6, phase="exiting", force=True)
    assert victim.read_text() == "precious\n"
    assert (run / HEARTBEAT).read_text() == "6 exiting\n" and not (run / HEARTBEAT).is_symlink()
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == [planted.name]  # no temp left
