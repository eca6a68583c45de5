"""A SIGKILL is called the OOM killer's only with evidence (issue 24): a hand-sent one, with a readable kernel log
that holds no record of the pid, says it was not; one with nothing readable says it cannot be told; an injected one
(MINILMD_FAULT) names itself. Real children, real signals; the kernel log is a fake `dmesg` first on PATH."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fake_kernel_log import NOW, fake_dmesg
from minilmd import names
from minilmd.daemon.child.death import classify
from minilmd.daemon.child.process import launch

KILL_SELF = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


def killed(tmp_path: Path, code: str = KILL_SELF):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    child = launch([sys.executable, "-c", code], run_dir, 1, devices="")
    rc = child.popen.wait(30)
    child.cgroup_oom = {}  # the host's cgroup layout is not this test's: only the kernel log speaks here
    return classify(child, rc, run_dir, stop_requested=False), child


def test_a_hand_sent_sigkill_with_a_readable_clean_kernel_log_is_not_the_oom_killer(tmp_path, monkeypatch):
    fake_dmesg(tmp_path, monkeypatch, "echo '[ 1.0] eth0: link up'; echo '[ 2.0] Killed process 1 (init)'")
    death, child = killed(tmp_path)
    assert death.cause == "killed", death
    assert "OOM killer" in death.detail and "not by the OOM killer" in death.detail, death.detail
    assert f"the kernel log holds no OOM record of pid {child.pid}" in death.detail, death.detail
    assert "probably" not in death.detail


def test_with_no_readable_record_it_says_it_cannot_be_told(tmp_path, monkeypatch):
    fake_dmesg(tmp_path, monkeypatch, "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1")
    death, _ = killed(tmp_path)
    assert death.cause == "killed" and "cannot be told" in death.detail and "probably" not in death.detail, death


WRITE_PID_AND_DIE = "import os, signal; open({!r}, 'w').write(str(os.getpid())); os.kill(os.getpid(), signal.SIGKILL)"
"""The child writes its pid (which the fake kernel log then names) and is "OOM-killed"."""


def test_a_kernel_log_record_of_the_pid_is_an_oom_kill(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    fake_dmesg(tmp_path, monkeypatch, f"echo \"[{NOW}] Out of memory: Killed process $(cat {pid_file}) (python)\"")
    death, child = killed(tmp_path, WRITE_PID_AND_DIE.format(str(pid_file)))
    assert death.cause == "oom_kill" and f"kernel log names pid {child.pid}" in death.detail, death


def test_a_record_of_an_earlier_process_of_the_same_pid_is_not_this_deaths(tmp_path, monkeypatch):
    """Pids are used again (32768 of them by default) and the kernel log keeps every OOM kill since boot: the clean-
    clone CI's second Ctrl-C test was called OOM-killed by the record of another test's child of the same pid, 23
    minutes older. Only a record stamped after the child's start is of it."""
    pid_file = tmp_path / "pid"
    fake_dmesg(tmp_path, monkeypatch, f"echo \"[    1.000000] Out of memory: Killed process $(cat {pid_file}) "
                                      f"(python)\"; echo \"[{NOW}] eth0: link up\"")
    death, child = killed(tmp_path, WRITE_PID_AND_DIE.format(str(pid_file)))
    assert death.cause == "killed", death
    assert f"the kernel log holds no OOM record of pid {child.pid}" in death.detail, death.detail


def test_records_without_a_time_cannot_tell(tmp_path, monkeypatch):
    """A kernel log printed without times (printk.time=0) cannot place a record after the start: not evidence."""
    pid_file = tmp_path / "pid"
    fake_dmesg(tmp_path, monkeypatch, f"echo \"Out of memory: Killed process $(cat {pid_file}) (python)\"")
    death, _ = killed(tmp_path, WRITE_PID_AND_DIE.format(str(pid_file)))
    assert death.cause == "killed" and "cannot be told" in death.detail, death


@pytest.mark.parametrize("kind,code,cause", [
    ("sigkill", KILL_SELF, "killed"),
    ("sigbus", "import os, signal; os.kill(os.getpid(), signal.SIGBUS)", "sigbus"),
])
def test_an_injected_fault_names_itself(tmp_path, monkeypatch, kind, code, cause):
    fake_dmesg(tmp_path, monkeypatch, "echo '[ 1.0] eth0: link up'")
    # what trainer/loop/faults.py does: the fault appended to faults-fired, then fired
    fired = tmp_path / "run" / names.FAULTS_FIRED
    death, _ = killed(tmp_path, f"open({str(fired)!r}, 'a').write('oom@3\\n{kind}@15\\n'); {code}")
    assert death.cause == cause and death.detail.endswith(f"(injected by MINILMD_FAULT: {kind}@15)"), death


def test_an_earlier_injected_fault_is_not_this_deaths(tmp_path, monkeypatch):
    fake_dmesg(tmp_path, monkeypatch, "echo '[ 1.0] eth0: link up'")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / names.FAULTS_FIRED).write_text("sigkill@15\n", encoding="utf-8")
    os.utime(run_dir / names.FAULTS_FIRED, (1, 1))  # written by an attempt long before this one
    child = launch([sys.executable, "-c", KILL_SELF], run_dir, 2, devices="")
    rc = child.popen.wait(30)
    child.cgroup_oom = {}
    death = classify(child, rc, run_dir, stop_requested=False)
    assert death.cause == "killed" and "injected" not in death.detail, death
