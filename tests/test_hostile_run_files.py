"""A run directory's files made hostile: state.json, the heartbeat, metrics.jsonl, trainer.json and the logs as a
FIFO nobody writes, a link to /dev/zero, a directory, a JSON list, a file someone made huge, or another user's.

Before the hardened reader (minilmd/untrusted.py through daemon/base/runstate.py), `minilmd status`, `stop --timeout 5`
(whose timeout was never reached), `plot`'s curves and `logs -f` hung on such a file or ran out of memory, and a
state.json one may not read was a PermissionError traceback. Now each says "unreadable (why)" and exits as it
would for the run otherwise. Every command runs as a real process under a memory limit (a read of /dev/zero would
take the machine's memory otherwise) and a timeout (a hang fails the test instead of blocking it).
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hostile_files_helpers import _limit_memory, make_hostile, minilmd
from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.fsio import atomic_write_json
from minilmd.protocol import EXIT_INTERRUPTED
from waiting import wait_until

pytestmark = pytest.mark.slow  # every test runs the real CLI against hostile files (hangs bounded by timeouts)

HOSTILE = {"fifo": "a FIFO", "zero": "a symbolic link", "directory": "a directory", "list": "a list, not an object"}


def run_dir_with(tmp_path: Path, name: str = "run", **state) -> Path:
    """A run directory whose supervisor is gone (a dead pid), with state.json saying `state`."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / names.RUN_CONFIG_COPY).write_text("[run]\n")
    body = new_state(name, run_dir, "x.toml")
    body["supervisor"].update(pid=2 ** 22 + 7, start_ticks=1)  # no such process
    body.update(state)
    atomic_write_json(run_dir / names.STATE, body)
    return run_dir


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_status_and_stop_say_why_a_state_json_is_unreadable(tmp_path, kind):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / names.RUN_CONFIG_COPY).write_text("[run]\n")
    make_hostile(run_dir / names.STATE, kind)

    shown = minilmd("status", str(run_dir))
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown
    assert f"state.json unreadable ({HOSTILE[kind]})" in shown.stdout, shown
    as_json = minilmd("status", "--json", str(run_dir))
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["unreadable"] == HOSTILE[kind], as_json

    stopped = minilmd("stop", "--timeout", "5", str(run_dir))
    assert stopped.returncode == 0 and "Traceback" not in stopped.stderr, stopped
    assert f"state.json unreadable ({HOSTILE[kind]})" in stopped.stdout and "not running" in stopped.stdout, stopped


def test_a_huge_state_json_is_not_read(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / names.RUN_CONFIG_COPY).write_text("[run]\n")
    make_hostile(run_dir / names.STATE, "huge")
    shown = minilmd("status", str(run_dir))
    assert shown.returncode == 0 and "state.json unreadable (over 8 MiB)" in shown.stdout, shown


@pytest.mark.parametrize("kind", ["fifo", "zero", "huge"])
def test_status_of_a_killed_run_whose_other_files_are_hostile(tmp_path, kind):
    """The heartbeat, metrics.jsonl (the sparkline, the epochs) and trainer.json (is its trainer still running?)
    of a run whose supervisor was killed: status shows the run, without them."""
    run_dir = run_dir_with(tmp_path, phase="training", progress={"step": 48, "total_steps": 100},
                           child={"pid": 2 ** 22 + 9, "attempt": 1, "log": "x"})
    for name in (names.HEARTBEAT, names.METRICS, names.TRAINER_RECORD):
        make_hostile(run_dir / name, kind)
    shown = minilmd("status", str(run_dir))
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown
    assert "step 48/100" in shown.stdout and "no trainer of this run is running" in shown.stdout, shown


def test_a_state_json_with_values_of_the_wrong_type(tmp_path):
    run_dir = run_dir_with(tmp_path, phase="training", progress={"step": "x", "total_steps": [1], "loss": "low"},
                           outcome=[1], restarts={"a": 1})
    shown = minilmd("status", str(run_dir))
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown
    assert "run run (" in shown.stdout and "training" in shown.stdout, shown


CURVES = """
import sys
from minilmd.daemon.views import curves

c = curves.load(sys.argv[1])
print(c.name, len(c.train), len(c.restarts), c.unreadable)
"""


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_plot_curves_of_a_run_with_hostile_files(tmp_path, kind):
    """What `minilmd plot` draws (daemon/views/curves.py, the same in a process without matplotlib): state.json
    and metrics.jsonl hostile, events.jsonl with times that are not numbers."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    make_hostile(run_dir / names.STATE, kind)
    make_hostile(run_dir / names.METRICS, kind)
    (run_dir / names.EVENTS).write_text(
        '{"event": "start", "time": "x"}\n{"event": "start", "time": "y"}\n[[[[1]]]]\n'
        '{"event": "child_exit", "cause": "killed", "step": "x", "time": 5}\n')
    done = subprocess.run([sys.executable, "-c", CURVES, str(run_dir)], capture_output=True, text=True, timeout=60,
                          preexec_fn=_limit_memory)
    assert done.returncode == 0, done
    assert done.stdout.split()[:3] == ["run", "0", "2"] and f"metrics.jsonl: unreadable ({HOSTILE[kind]})" in \
        done.stdout, done


def test_plot_of_a_huge_metrics_file_reads_only_its_end(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    make_hostile(run_dir / names.METRICS, "huge")
    with open(run_dir / names.METRICS, "ab") as f:
        f.write(b'\n{"kind": "train", "step": 1, "loss": 2.5, "time": 1.0}\n')
    done = subprocess.run([sys.executable, "-c", CURVES, str(run_dir)], capture_output=True, text=True, timeout=60,
                          preexec_fn=_limit_memory)
    assert done.returncode == 0 and done.stdout.split()[:2] == ["run", "1"], done


def test_logs_follow_says_a_log_is_unreadable_and_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    make_hostile(run_dir / names.STATE, "fifo")
    make_hostile(run_dir / names.SUPERVISOR_LOG, "fifo")
    logs = run_dir / names.ATTEMPT_LOGS
    logs.mkdir()
    attempt = logs / names.attempt_log_name(1)
    make_hostile(attempt, "zero")
    out = tmp_path / "logs.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "logs", "-f", str(run_dir)], stdout=sink,
                                stderr=subprocess.STDOUT, preexec_fn=_limit_memory)
    try:
        wait_until(lambda: out.read_text().count("unreadable (") >= 2, timeout=60, what="both logs said unreadable")
        assert proc.poll() is None, out.read_text()  # still following
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == EXIT_INTERRUPTED, out.read_text()  # Ctrl-C: 130, as every command
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    assert "unreadable (a FIFO)" in text and "unreadable (a symbolic link)" in text and "Traceback" not in text, text


def test_the_supervisors_own_readers_skip_hostile_files(tmp_path):
    """The heartbeat and metrics.jsonl as the supervisor reads them (daemon/base/runstate.py), in a process of its own:
    a FIFO heartbeat is no heartbeat, metrics.jsonl as a link to /dev/zero is a problem, not a read for ever."""
    code = """
import sys
from pathlib import Path
from minilmd.daemon.base.runstate import MetricsTail, read_heartbeat
run_dir = Path(sys.argv[1])
tail = MetricsTail(run_dir / "metrics.jsonl")
print(read_heartbeat(run_dir), tail.read_new(), tail.problem)
"""
    make_hostile(tmp_path / names.HEARTBEAT, "fifo")
    make_hostile(tmp_path / names.METRICS, "zero")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          preexec_fn=_limit_memory)
    assert done.returncode == 0 and done.stdout.split() == ["None", "[]", "a", "symbolic", "link"], done
