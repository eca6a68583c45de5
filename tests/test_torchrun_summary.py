"""Which signal ended a torchrun group, read from the agent's failure summary (daemon/child/torchrun_summary.py):
the root cause's exitcode field only, never a number a rank's output or its quoted error holds.

The summaries below were captured from `python -m minilmd.trainer.loop.torchrun --standalone --nproc_per_node 2`
(torch 2.x, gloo on CPU; paths shortened), their ranks as RANK_CRASH and RANK_KILLED; the slow test runs the first.
"""
from __future__ import annotations

import sys
import textwrap

import pytest

from minilmd.daemon.child.death import classify
from minilmd.daemon.child.process import build_command, launch, wait_bounded
from minilmd.daemon.child.torchrun_summary import root_cause_signal

RANK_CRASH = textwrap.dedent("""
    import os, time
    from torch.distributed.elastic.multiprocessing.errors import record


    @record
    def main():
        if os.environ["RANK"] == "1":
            raise RuntimeError("cannot read /team/ckpt/run\\nexitcode : -9 (pid: 1) (SIGKILL)")
        time.sleep(60)


    main()
""")
"""Rank 1 crashes (exit 1) with an error whose second line looks like a SIGKILL's exitcode field; rank 0 is then
stopped by the agent (SIGTERM, listed under "Failures:")."""

CRASH_LOG = """\
W1206 04:00:13.370000 9337 torch/distributed/run.py:874] *****************************************
Traceback (most recent call last):
  File "/tmp/rank_rec.py", line 12, in <module>
    main()
  File "/venv/.../torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/tmp/rank_rec.py", line 8, in main
    raise RuntimeError("cannot read /team/ckpt/run\\nexitcode : -9 (pid: 1) (SIGKILL)")
RuntimeError: cannot read /team/ckpt/run
exitcode : -9 (pid: 1) (SIGKILL)
W1206 04:00:17.404000 9337 .../api.py:1028] Sending process 9399 closing signal SIGTERM
E1206 04:00:17.426000 9337 .../api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 9400) of binary: /venv/bin/python
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
rank_rec.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-06_04:00:17
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 9399)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 9399
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-06_04:00:16
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 9400)
  error_file: /tmp/torchelastic_wdk7_qif/8721f776_u89m_krj/attempt_0/1/error.json
  traceback : Traceback (most recent call last):
    File "/venv/.../torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
      return f(*args, **kwargs)
             ^^^^^^^^^^^^^^^^^^
    File "/tmp/rank_rec.py", line 8, in main
      raise RuntimeError("cannot read /team/ckpt/run\\nexitcode : -9 (pid: 1) (SIGKILL)")
  RuntimeError: cannot read /team/ckpt/run
  exitcode : -9 (pid: 1) (SIGKILL)

============================================================
"""

KILLED_LOG = """\
exitcode : -7 quoted by rank 1
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
rank_kill.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-06_04:00:24
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 9606)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 9606
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-06_04:00:24
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 9607)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 9607
======================================================
"""
"""Rank 1 printed a fake field, then was SIGKILLed (os.kill of itself); rank 0 was stopped by the agent."""


def test_a_crash_quoting_a_sigkill_exitcode_is_not_a_signal():
    assert root_cause_signal(CRASH_LOG.splitlines()) is None  # the last "exitcode : -N" says 9, the field 1


def test_the_root_causes_signal_not_the_stopped_ranks_nor_a_printed_one():
    assert root_cause_signal(KILLED_LOG.splitlines()) == 9


def test_no_summary_no_signal():
    assert root_cause_signal(["exitcode  : -9 (pid: 1)", "Killed"]) is None
    header_only = KILLED_LOG.split("[0]:")[0].splitlines()  # a tail cut after the header: no field read
    assert root_cause_signal(header_only) is None


def test_a_torchrun_crash_whose_summary_quotes_a_sigkill_is_classified_a_crash(tmp_path):
    child = launch([sys.executable, "-c", f"import sys; sys.stderr.write({CRASH_LOG!r}); sys.exit(1)"],
                   tmp_path, 1, devices="")
    rc = wait_bounded(child.popen, 60)
    child.command = build_command(tmp_path / "run.toml", {}, nproc=2)  # what classify reads the summary for
    assert rc == 1 and classify(child, rc, tmp_path, stop_requested=False).cause == "crash"


@pytest.mark.slow
def test_a_real_torchrun_group_whose_rank_crashes_with_a_fake_field_is_a_crash(tmp_path):
    rank = tmp_path / "rank.py"
    rank.write_text(RANK_CRASH)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    command = build_command(tmp_path / "run.toml", {}, nproc=2)
    agent = command[:command.index("minilmd.cli") - 1]  # the agent as the supervisor starts it, up to its ranks'
    child = launch([*agent, str(rank)], run_dir, 1, devices="")
    rc = wait_bounded(child.popen, 300)
    if rc is None:
        child.kill()
        wait_bounded(child.popen, 30)
    log = child.log_path.read_text(errors="replace")
    assert rc == 1 and "exitcode : -9 (pid: 1)" in log, log[-3000:]
    assert classify(child, rc, run_dir, stop_requested=False).cause == "crash", log[-3000:]
