"""A record of a process written before the machine restarted names no process of this boot (minilmd/proc_info.py
process_alive, the one judge): a service started at boot gets much the same pid and start ticks each boot, so a
record's pid and start ticks alone could match whatever process of the new boot runs under them now.

Every process here is real and alive while the record is judged; only the boot the record names differs. The same
record with this boot's id is the control, and a record without a boot id (an older minilmd's) is judged by pid and
start ticks as before. The other surfaces' tests: tests/test_remote_tmp_recycled_pid.py (a sync's temporary names on
the remote), tests/test_export_way_out.py and tests/test_prepare_leftovers.py (an export's and a prepare's
temporaries), tests/test_status_other_boot.py (state.json's supervisor); a checkpoint root's temporaries
(a save's, a fetch's, a prune's, a publish's) here."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import names, tmpnames, trainer_lock
from minilmd.daemon.child import orphans
from minilmd.fsio import atomic_write_json
from minilmd.perms import signal_uid
from minilmd.proc_info import boot_id, boot_tag, of_another_boot, process_alive, process_start_ticks, this_process
from waiting import wait_until

ANOTHER_BOOT = "00000000-0000-4000-8000-000000000000"
"""A boot id of no boot of this test's (the kernel draws them at random: this boot's is not all zeros)."""


@pytest.fixture(autouse=True)
def _this_kernel_gives_a_boot_id():
    assert boot_id() and boot_tag() and not boot_id().startswith("00000000"), boot_id()


def _live(env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            env={**os.environ, **(env or {})})


@pytest.fixture
def live_process():
    """(pid, start ticks) of a process that runs while the test judges a record of it."""
    proc = _live()
    try:
        yield proc.pid, wait_until(lambda: process_start_ticks(proc.pid), 30, "its start time")
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_a_live_processs_record_is_alive_only_in_its_own_boot(live_process):
    pid, ticks = live_process
    assert process_alive(pid, ticks, boot_id())  # the control: this boot's id, in full (a JSON record's)
    assert process_alive(pid, ticks, boot_tag())  # or its tag (a temporary name's)
    assert not process_alive(pid, ticks, ANOTHER_BOOT)
    assert not process_alive(pid, ticks, ANOTHER_BOOT[:8])


@pytest.mark.parametrize("malformed", ["another", "0000000A-0000-4000-8000-000000000000", ANOTHER_BOOT[:35],
                                       ANOTHER_BOOT + "0", ANOTHER_BOOT[:7], " " + ANOTHER_BOOT])
def test_a_record_whose_boot_is_no_boot_id_is_judged_by_pid_and_start_ticks(live_process, malformed):
    """A boot that is neither a boot id's form nor a tag's says no boot, as an older minilmd's record does: taken for
    another boot's, it said its live process gone (trainer.lock's holder, an orphan's launch, a leftover's maker)."""
    pid, ticks = live_process
    assert not of_another_boot(malformed)
    assert process_alive(pid, ticks, malformed)
    assert not trainer_lock._holder_gone({"pid": pid, "host": socket.gethostname(), "boot": malformed})
    assert not process_alive(pid, None, ANOTHER_BOOT)  # a record with no start time, of another boot
    assert not process_alive(pid, ticks + 1, boot_id())  # a recycled pid, as before


def test_a_record_without_a_boot_id_is_judged_by_pid_and_start_ticks_as_before(live_process):
    pid, ticks = live_process
    assert process_alive(pid, ticks, "") and process_alive(pid, ticks) and process_alive(pid)
    assert not process_alive(pid, ticks + 1, "")
    assert not of_another_boot("") and of_another_boot(ANOTHER_BOOT) and not of_another_boot(boot_id())


def test_a_dead_processs_record_is_dead_in_any_boot():
    proc = _live()
    ticks = wait_until(lambda: process_start_ticks(proc.pid), 30, "its start time")
    proc.kill()
    proc.wait(timeout=60)
    assert not any(process_alive(proc.pid, ticks, boot) for boot in ("", boot_id(), boot_tag(), ANOTHER_BOOT))


# --- trainer.json: the orphan hunt of a restarted supervisor, `minilmd stop` -------------------------------------

@pytest.fixture
def orphan(tmp_path):
    """A run directory and a live process of it as a trainer of a launch is (its environment carries the run
    directory and the launch id): what a supervisor's orphan hunt looks for, and SIGTERMs."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    launch_id = "ab" * 16
    proc = _live({names.RUN_DIR_ENV: str(run_dir.resolve()), names.LAUNCH_ID_ENV: launch_id})
    try:
        yield run_dir, launch_id, proc, wait_until(lambda: process_start_ticks(proc.pid), 30, "its start time")
    finally:
        proc.kill()
        proc.wait(timeout=60)


def _trainer_record(run_dir: Path, launch_id: str, pid: int, ticks: int, boot: str | None) -> None:
    """trainer.json as record_launch writes it, but of boot `boot` (None: an older minilmd's, no boot field)."""
    record = {"launch_id": launch_id, "uid": signal_uid(), "host": socket.gethostname(), "attempt": 1, "pid": pid,
              "start_ticks": ticks, "time": 0.0}
    atomic_write_json(run_dir / names.TRAINER_RECORD, record if boot is None else {**record, "boot": boot})


def test_a_trainer_record_writes_this_boot(tmp_path):
    orphans.record_launch(tmp_path, 1, "cd" * 16, 4242, 90210)
    assert json.loads((tmp_path / names.TRAINER_RECORD).read_text())["boot"] == boot_id()


@pytest.mark.parametrize("boot", ["this", None])  # this boot's record (record_launch's), an older minilmd's
def test_a_trainer_record_of_this_boot_names_its_live_orphan(orphan, boot):
    run_dir, launch_id, proc, ticks = orphan
    if boot == "this":
        orphans.record_launch(run_dir, 1, launch_id, proc.pid, ticks)
    else:
        _trainer_record(run_dir, launch_id, proc.pid, ticks, None)
    assert orphans.find_orphans(run_dir) == [proc.pid]


def test_a_trainer_record_of_another_boot_names_no_process(orphan):
    """Its pid and start ticks, and even the launch id in a live process's environment, are those of the record:
    only the boot differs. No orphan, and the hunt signals nothing: the process runs on."""
    run_dir, launch_id, proc, ticks = orphan
    _trainer_record(run_dir, launch_id, proc.pid, ticks, ANOTHER_BOOT)
    assert orphans.recorded_launch(run_dir) is None and orphans.find_orphans(run_dir) == []
    assert orphans.terminate_orphans(run_dir, grace=0.0) == []
    assert proc.poll() is None and process_alive(proc.pid, ticks)


def test_the_control_the_same_record_of_this_boot_is_hunted(orphan):
    run_dir, launch_id, proc, ticks = orphan
    _trainer_record(run_dir, launch_id, proc.pid, ticks, boot_id())
    assert orphans.terminate_orphans(run_dir, grace=60.0) == [proc.pid]
    assert proc.wait(timeout=60) == -signal.SIGTERM


# --- trainer.lock's body: who holds the lock, while a trainer waits for it ---------------------------------------

def test_a_trainer_lock_body_of_another_boot_names_no_holder(live_process):
    pid, _ = live_process
    body = {"pid": pid, "host": socket.gethostname()}
    assert trainer_lock._holder_gone({**body, "boot": ANOTHER_BOOT})
    assert not trainer_lock._holder_gone({**body, "boot": boot_id()})  # the control
    assert not trainer_lock._holder_gone(body)  # an older minilmd's body: by its pid, as before
    assert json.loads(trainer_lock._body(True, Path("/run"), 0, None))["boot"] == boot_id()


def test_a_checkpoint_roots_temporary_of_a_live_process_is_removed_only_once_its_maker_is_gone(tmp_path, live_process):
    """A save's, a fetch's, a prune's and a publish's temporary names record pid, start ticks and boot (scratch on a
    local disk outlives a reboot): a live process under the same pid but of another boot or start time is no maker,
    and its leftover goes; the control, this boot's record of that live process, is left."""
    from minilmd.checkpoint_dirs import clean_stale_tmp

    pid, ticks = live_process
    step = names.step_name(4)
    made = {
        "another boot": tmpnames.save_tmp_name(4, pid, ticks, "00000000"),
        "another start": tmpnames.fetch_tmp_name(step, pid, ticks + 1, boot_tag()),
        "a prune's of another boot": tmpnames.deleting_name(step, pid, ticks, "00000000"),
        "the control": tmpnames.replaced_name(step, pid, ticks, boot_tag()),
        "an older minilmd's, pid alone": tmpnames.save_tmp_name(8, pid),
    }
    for name in made.values():
        (tmp_path / name).mkdir()
    removed = {p.name for p in clean_stale_tmp(tmp_path, say=lambda _: None)}
    assert removed == {made["another boot"], made["another start"], made["a prune's of another boot"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([made["the control"],
                                                                 made["an older minilmd's, pid alone"]])


def test_a_checkpoint_roots_temporary_names_record_this_process():
    pid, ticks, boot = this_process()
    assert (pid, ticks, boot) == (os.getpid(), process_start_ticks(os.getpid()), boot_tag())
    assert tmpnames.root_tmp_maker(tmpnames.save_tmp_name(3, *this_process())) == (pid, ticks, boot)
