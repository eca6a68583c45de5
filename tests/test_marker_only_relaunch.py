"""The new user's way out of a launch that failed at once on a full run.dir (a 1 MiB tmpfs, filled): `--check`
notes the file system's free bytes (daemon/phases/rundirwatch.py room_note), the launch exits 73 and leaves the
scratch it claimed holding only owner.json; run.dir removed and set on a roomier disk, the check names that scratch
as the marker of a run.dir that is gone, with `rm -r` or run.scratch as the way on (before: `belongs to another
run` naming a run that never started), and once it is removed the check passes. Nothing removed by minilmd."""
from __future__ import annotations

import shutil

import pytest

from minilmd import protocol
from minilmd.config import load_config
from minilmd.names import SCRATCH_OWNER
from supervisor_helpers import cli, start_supervisor, wait_or_kill, write_config

pytestmark = pytest.mark.slow  # a real tmpfs and a real launch


def _fill(disk) -> None:
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_launch_on_a_full_run_dir_then_moved_names_the_scratch_it_left(tmp_path, corpus, small_tmpfs):
    disk = small_tmpfs("1m")
    _fill(disk)
    full = write_config(tmp_path, corpus, name="moved", run={"dir": str(disk / "run")})
    checked = cli("run", str(full), "--check")
    said = " ".join((checked.stdout + checked.stderr).split())
    assert checked.returncode == 0 and f"run.dir {disk / 'run'}: its file system has 0 bytes free" in said, said
    rc = wait_or_kill(start_supervisor(full, tmp_path / "sup.out"), 120)
    assert rc == protocol.SUPERVISOR_RUN_DIR_FULL, (tmp_path / "sup.out").read_text()
    scratch = load_config(str(full)).scratch_dir
    assert (scratch / SCRATCH_OWNER).exists()  # the launch claimed it before it met the full run.dir
    shutil.rmtree(disk / "run", ignore_errors=True)
    roomy = write_config(tmp_path, corpus, name="moved", run={"dir": str(tmp_path / "roomy" / "run")})
    refused = cli("run", str(roomy), "--check")
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == protocol.SUPERVISOR_CONFIG, said
    assert f"{scratch} holds only the marker of the run in {disk / 'run'}, whose run.dir is gone" in said, said
    assert f"`rm -r {scratch}`" in said and "belongs to another run" not in said, said
    assert (scratch / SCRATCH_OWNER).exists()  # said, never removed
    shutil.rmtree(scratch)
    again = cli("run", str(roomy), "--check")
    assert again.returncode == 0, again.stdout + again.stderr
