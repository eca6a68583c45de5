"""A state.json written before the machine restarted names no process of this boot (minilmd/proc_info.py boot_id).

A supervisor started by systemd at boot gets much the same pid and start time (clock ticks since boot) each boot: the
pid and start time alone, recorded before a reboot, could match whatever process runs under them now, and `minilmd
status` would say "running" of a run nothing runs for. state.json records the boot id with them; a record of another
boot is not running, and status says the host restarted (not "killed or crashed").

The supervisor recorded here is a real process of this test, alive while status looks: only the boot id recorded
with it differs, and the same record with this boot's id is the control (running). The overview's row says the same
(`(host restarted since)`, not `(killed or crashed)`, after a final phase with no outcome written).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.host import registry
from minilmd.daemon.views.overview import _cells, row
from minilmd.fsio import atomic_write_json
from minilmd.proc_info import boot_id, of_another_boot, process_start_ticks
from supervisor_helpers import cli

ANOTHER_BOOT = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def live_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield proc.pid, process_start_ticks(proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=60)


def state_of(tmp_path: Path, pid: int, ticks: int, boot: str, phase: str = "training") -> Path:
    """A run directory whose state.json names the supervisor (pid, ticks) of boot `boot`, last in `phase`, no
    outcome written."""
    run_dir = tmp_path / f"{boot or 'no-boot-id'}-{phase}"
    run_dir.mkdir()
    st = new_state("r", run_dir, str(run_dir / names.RUN_CONFIG_COPY))
    st.update(phase=phase, supervisor={"pid": pid, "start_ticks": ticks, "boot": boot,
                                       "host": socket.gethostname(), "started": time.time() - 60})
    atomic_write_json(run_dir / names.STATE, st)
    return run_dir


def status_of(tmp_path: Path, pid: int, ticks: int, boot: str) -> str:
    done = cli("status", str(state_of(tmp_path, pid, ticks, boot)))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow  # `minilmd status` in a subprocess, twice
def test_a_record_of_another_boot_is_not_running_though_its_pid_and_start_time_match(tmp_path, live_process):
    pid, ticks = live_process
    assert boot_id(), "this kernel gives no boot id"
    said = status_of(tmp_path, pid, ticks, ANOTHER_BOOT)
    assert "not running (last seen" in said and "this host has restarted since (another boot id)" in said, said
    assert f"supervisor pid {pid}" not in said and "killed or crashed" not in said, said
    control = status_of(tmp_path, pid, ticks, boot_id())
    assert f"supervisor pid {pid} running" in control and "restarted" not in control, control


@pytest.mark.slow
def test_a_record_without_a_boot_id_is_judged_by_pid_and_start_time_as_before(tmp_path, live_process):
    pid, ticks = live_process
    assert not of_another_boot("") and of_another_boot(ANOTHER_BOOT) and not of_another_boot(boot_id())
    said = status_of(tmp_path, pid, ticks, "")
    assert f"supervisor pid {pid} running" in said, said


def test_the_overview_row_of_a_run_ended_in_another_boot_says_the_host_restarted(tmp_path, live_process):
    pid, ticks = live_process

    def phase_cell(boot: str) -> str:
        run_dir = state_of(tmp_path, pid, ticks, boot, phase="done")
        r = row(registry.Entry("r", run_dir, "r.toml", os.getuid(), tmp_path / "entry"), time.time())
        return _cells(r)[1]

    assert phase_cell(ANOTHER_BOOT) == "done (host restarted since)"
    assert phase_cell(boot_id()) == "done"  # the control: its supervisor, alive, has not written how it ended yet


def test_a_new_state_records_this_boot():
    st = new_state("r", Path("/nonexistent"), "run.toml")
    assert st["supervisor"]["boot"] == boot_id() != ""
