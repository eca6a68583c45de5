"""Death classification, the restart rules, the state table and sd_notify, without a supervisor around them.

Children here are real short processes (a real SIGBUS, a real exit status); the policy is a pure function.
"""
from __future__ import annotations

import ast
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from minilmd import names, protocol, pychild
from minilmd.config import RestartSection, RunConfig
from minilmd.daemon.base.runstate import MetricsTail, RunState, process_alive
from minilmd.daemon.base.states import TRANSITIONS, IllegalTransition, Phase, check_transition
from minilmd.daemon.child import orphans
from minilmd.daemon.child import process as childmod
from minilmd.daemon.child.death import Death, classify
from minilmd.daemon.child.policy import backoff_seconds, decide, decide_staging_failure
from minilmd.daemon.child.process import build_command, launch
from minilmd.daemon.child.trainerwatch import death_facts
from minilmd.daemon.host.sdnotify import Notifier
from minilmd.daemon.infra import Infra
from minilmd.daemon.jobs.staging import stage
from minilmd.daemon.jobs.stagingworker import StagingWorker
from waiting import wait_until


def run_child(tmp_path: Path, code: str, attempt: int = 1) -> tuple[childmod.Child, int]:
    c = launch([sys.executable, "-c", code], tmp_path, attempt, devices="")
    return c, c.popen.wait(30)


@pytest.mark.parametrize("code,cause", [
    ("import sys; sys.exit(0)", "done"),
    ("import sys; sys.exit(75)", "stopped"),
    ("import sys; sys.exit(2)", "config_error"),
    ("import sys; sys.exit(65)", "data_error"),
    ("raise RuntimeError('boom')", "crash"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGBUS)", "sigbus"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "killed"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "signal"),
])
def test_every_end_has_one_cause(tmp_path, code, cause):
    c, rc = run_child(tmp_path, code)
    death = classify(c, rc, tmp_path, stop_requested=False)
    assert death.cause == cause
    if cause == "crash":
        assert "RuntimeError: boom" in death.detail  # the traceback's last line, from the attempt log


def test_a_real_sigbus_from_a_truncated_mapping(tmp_path):
    data = tmp_path / "tokens.bin"
    data.write_bytes(b"\1" * 65536)
    code = (f"import mmap, os; f = open({str(data)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); "
            f"os.truncate({str(data)!r}, 0); m[40000]")
    c, rc = run_child(tmp_path, code)
    assert rc == -signal.SIGBUS
    assert classify(c, rc, tmp_path, stop_requested=False).cause == "sigbus"


def test_cuda_oom_comes_from_the_fault_note_and_is_consumed(tmp_path):
    code = (f"from minilmd.protocol import write_fault; write_fault({str(tmp_path)!r}, 'cuda_oom', "
            f"'CUDA out of memory. Tried to allocate 144.00 MiB', step=7); raise SystemExit(76)")
    c, rc = run_child(tmp_path, code)
    death = classify(c, rc, tmp_path, stop_requested=False)
    assert death.cause == "cuda_oom" and "144.00 MiB" in death.detail and death.fault["step"] == 7
    assert not (tmp_path / names.FAULT).exists()


def test_a_stale_fault_note_from_an_earlier_attempt_is_ignored(tmp_path):
    protocol.write_fault(tmp_path, protocol.FaultNote.CUDA_OOM, "old")
    old = time.time() - 3600
    os.utime(tmp_path / names.FAULT, (old, old))
    c, rc = run_child(tmp_path, "raise SystemExit(1)")
    assert classify(c, rc, tmp_path, stop_requested=False).cause == "crash"


def test_the_child_gets_its_own_group_run_dir_and_devices(tmp_path):
    c, rc = run_child(tmp_path, "import os; print(os.getpgid(0) == os.getpid(), os.environ['MINILMD_RUN_DIR'], "
                                "repr(os.environ['CUDA_VISIBLE_DEVICES']))")
    assert rc == 0
    log = c.log_path.read_text()
    assert c.log_path.name == "attempt-0001.log"
    assert f"True {tmp_path.resolve()} ''" in log


def test_orphans_are_found_by_their_run_dir_and_terminated(tmp_path):
    c = launch([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path, 1, devices="")
    other = launch([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "other", 1, devices="")
    try:
        def found_it() -> list[int] | None:
            found = orphans.find_orphans(tmp_path)
            return found if c.pid in found else None

        found = wait_until(found_it, 60, "the run's process among its orphans")
        assert found == [c.pid]  # not the other run's process
        assert orphans.terminate_orphans(tmp_path, grace=5) == found
        assert c.popen.wait(60) == -signal.SIGTERM
        assert process_alive(other.pid)
    finally:
        other.kill_group()
        c.kill_group()


def test_build_command_plain_and_torchrun(tmp_path, monkeypatch):
    monkeypatch.delenv(childmod.TRAINER_CMD_ENV, raising=False)
    plain = build_command(tmp_path / "run.toml", {"data.prepared": "/s/c", "train.micro_batch_size": 8})
    assert plain == [*pychild.module_argv("minilmd.cli"), "train", str(tmp_path / "run.toml"),
                     "--set", 'data.prepared="/s/c"', "--set", "train.micro_batch_size=8"]
    multi = build_command(tmp_path / "run.toml", {}, nproc=4)
    assert multi[:-2] == pychild.module_argv(names.TORCHRUN_LAUNCHER, "--standalone", "--nproc_per_node",
                                                         "4", "--max-restarts", "0", "-m", "minilmd.cli")


# --- the policy -------------------------------------------------------------------------------------------------

RESTART = RestartSection(max_restarts=10, backoff_initial="1s", backoff_max="8s", no_progress_limit=3)


def rule(cause: str, **kw) -> object:
    args = dict(restart=RESTART, restarts_so_far=0, no_progress_streak=1, stop_requested=False,
                micro_batch_size=32, grad_accum=1)
    args.update(kw)
    return decide(Death(cause, None, "detail"), **args)


def test_policy_rules():
    assert rule("done").action == "finish"
    assert rule("crash", stop_requested=True).action == "stop"
    assert (rule("config_error").action, rule("config_error").exit_status) == ("fail", 2)
    assert (rule("data_error").action, rule("data_error").exit_status) == ("fail", 65)
    assert rule("sigbus", staged_damaged=True).action == "restage"
    assert rule("sigbus", staged_damaged=False).action == "restart"
    assert rule("cuda_oom", gpu_busy=True).action == "wait_gpu"
    oom = rule("cuda_oom", micro_batch_size=32, grad_accum=2)
    assert oom.action == "restart" and oom.overrides == {"train.micro_batch_size": 16, "train.grad_accum": 4}
    odd = rule("cuda_oom", micro_batch_size=6, grad_accum=1)
    assert odd.overrides == {"train.micro_batch_size": 3, "train.grad_accum": 2}
    prime = rule("cuda_oom", micro_batch_size=5, grad_accum=3)
    assert prime.overrides == {"train.micro_batch_size": 1, "train.grad_accum": 15}  # global batch kept exact
    assert rule("cuda_oom", micro_batch_size=1).overrides == {}
    for cause in ("hang", "killed", "oom_kill", "crash", "signal", "stopped"):
        assert rule(cause).action == "restart"
    gave_up = rule("crash", no_progress_streak=3)
    assert (gave_up.action, gave_up.exit_status) == ("fail", protocol.SUPERVISOR_GAVE_UP)
    assert rule("crash", restarts_so_far=10).exit_status == protocol.SUPERVISOR_GAVE_UP
    assert rule("config_error", restarts_so_far=10).exit_status == 2  # the cause, not the count, is reported


def test_staging_failure_rules():
    """A staging that failed: final (2, 65) as staging said, else staged again after a backoff until
    restart.no_progress_limit failures in a row give up (79). The final ones keep no streak (counts_as_restart)."""
    def staging(status=None, streak=1):
        return decide_staging_failure("a file stays short", status, restart=RESTART, no_progress_streak=streak)

    for status in (protocol.SUPERVISOR_CONFIG, protocol.EXIT_DATA):
        final = staging(status, streak=RESTART.no_progress_limit)
        assert (final.action, final.exit_status, final.counts_as_restart) == ("fail", status, False)
        assert final.message == "a file stays short"
    again = staging(streak=RESTART.no_progress_limit - 1)
    assert (again.action, again.exit_status, again.counts_as_restart) == ("restage", None, True)
    assert again.message == "staging failed: a file stays short"
    gave_up = staging(streak=RESTART.no_progress_limit)
    assert (gave_up.action, gave_up.exit_status, gave_up.counts_as_restart) == ("fail", protocol.SUPERVISOR_GAVE_UP,
                                                                                True)
    assert gave_up.message == "gave up: staging failed 3 times in a row (restart.no_progress_limit): " \
                              "a file stays short"


@pytest.mark.parametrize("damaged", [True, False])
def test_a_data_error_restages_a_damaged_staged_corpus_and_is_final_on_an_intact_one(tmp_path, corpus, damaged):
    """The trainer's exit 65 is final only when the staged copy verifies: a copy that broke in scratch (here a
    truncated tokens.bin) is the supervisor's to repair, not the source's fault."""
    staged = stage(str(corpus[0]), tmp_path / "shm")
    if damaged:
        tokens = staged / "train" / "tokens.bin"
        os.truncate(tokens, tokens.stat().st_size // 2)
    staging = StagingWorker(cfg=None, infra=Infra(), state=None, emit=None, inbox=None, syncer_for=None)
    staging.staged = staged  # what the staging phase left for the trainer
    c, rc = run_child(tmp_path, "import sys; sys.exit(65)")
    death = classify(c, rc, tmp_path, stop_requested=False)
    assert death.cause == "data_error"
    emitted = []
    cfg = RunConfig()
    cfg.run.dir, cfg.run.scratch = str(tmp_path), str(tmp_path / "shm")
    state = RunState(tmp_path / "state.json", {})
    facts = death_facts(death, c, cfg, state, staging, gpu=None,
                        emit=lambda kind, message, **_: emitted.append((kind, message)))
    assert facts == {"staged_damaged": damaged}
    decision = decide(death, restart=RESTART, restarts_so_far=0, no_progress_streak=1, stop_requested=False,
                      micro_batch_size=32, grad_accum=1, **facts)
    if damaged:
        assert decision.action == "restage" and decision.counts_as_restart
        assert "staged corpus fails verification: re-staging it" in decision.message
        assert [kind for kind, _ in emitted] == ["staging"] and "train/tokens.bin" in emitted[0][1]
    else:  # the source itself is bad: final, the supervisor exits 65 without a restart
        assert (decision.action, decision.exit_status, decision.counts_as_restart) == ("fail", 65, False)
        assert decision.message.startswith("data error, final: ") and emitted == []


def test_backoff_doubles_with_jitter_up_to_the_cap():
    rng = random.Random(0)
    for streak, base in ((1, 1), (2, 2), (3, 4), (4, 8), (9, 8)):
        delays = [backoff_seconds(RESTART, streak, rng) for _ in range(50)]
        assert all(base * 0.5 <= d <= base for d in delays)
        assert max(delays) - min(delays) > 0  # jittered


# --- states, metrics, sd_notify ---------------------------------------------------------------------------------

def test_the_transition_table():
    assert check_transition(Phase.TRAINING, Phase.BACKOFF) == "child_died"
    for live in (Phase.WAITING_GPU, Phase.STAGING, Phase.STARTING, Phase.TRAINING, Phase.BACKOFF):
        assert check_transition(live, Phase.STOPPING) == "stopping"
        assert check_transition(live, Phase.FAILED) == "gave_up"
    with pytest.raises(IllegalTransition):
        check_transition(Phase.DONE, Phase.STARTING)
    with pytest.raises(IllegalTransition):
        check_transition(Phase.WAITING_GPU, Phase.TRAINING)
    assert not any(old in (Phase.DONE, Phase.FAILED) for old, _ in TRANSITIONS)


def state_writes(tree: ast.AST) -> list[str]:
    """The assignments to a `state.phase` or `state.reason` (any object named `state`, `self.state`) in `tree`."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in ("phase", "reason"):
                owner = target.value
                if (isinstance(owner, ast.Name) and owner.id == "state") or \
                        (isinstance(owner, ast.Attribute) and owner.attr == "state"):
                    found.append(f"line {node.lineno}: {ast.unparse(target)}")
    return found


def test_the_loop_alone_writes_the_phase_and_its_reason():
    """One record of the phase (state.json's), written by the supervisor's loop only: the parts return their reason
    text for it (SpaceWaiter.reason(), SyncWorker.room_wait), so no part can leave a reason that the phase has not.
    Before the loop runs, the launch's own phase (states.LAUNCH_PHASES: its wait for scratch) is its record's."""
    daemon = Path(childmod.__file__).resolve().parents[1]
    writers = {str(path.relative_to(daemon)): found for path in sorted(daemon.rglob("*.py"))
               if (found := state_writes(ast.parse(path.read_text(encoding="utf-8"))))}
    assert set(writers) == {"supervisor.py", "waitrecord.py"}, writers  # the first phase; _go's; _say's reason


def test_metrics_tail_reads_only_whole_new_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read_new() == []
    path.write_text('{"kind": "train", "step": 1}\n{"kind": "train", "st')
    assert [r["step"] for r in tail.read_new()] == [1]
    with open(path, "a") as f:
        f.write('ep": 2}\nnot json\n{"kind": "eval", "step": 2}\n')
    assert [r["kind"] for r in tail.read_new()] == ["train", "eval"]
    assert tail.read_new() == []


def test_sd_notify_sends_ready_status_and_watchdog(tmp_path):
    addr = str(tmp_path / "notify")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(addr)
    server.settimeout(2)
    n = Notifier({"NOTIFY_SOCKET": addr, "WATCHDOG_USEC": "2000000"})
    n.ready("waiting_gpu")
    assert server.recv(100).decode() == "READY=1\nSTATUS=waiting_gpu"
    n.watchdog()
    assert server.recv(100) == b"WATCHDOG=1"
    n.watchdog()  # within the interval (1 s): nothing sent
    n.status("x")
    assert server.recv(100) == b"STATUS=x"
    assert Notifier({}).send("READY=1") is False


def test_a_heartbeat_of_the_previous_attempt_never_counts_as_the_new_ones(tmp_path):
    """Found by the pipeline soak: attempt N's last heartbeat, written within a second of attempt N+1's launch,
    passed for N+1's own; its start-up grace became hang_timeout and it was killed as hung while importing."""
    from minilmd.daemon.base.runstate import read_heartbeat

    (tmp_path / names.HEARTBEAT).write_text("40\n")  # the previous attempt's, just now
    child = launch([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path, 2, "")
    try:
        assert not child.beats(read_heartbeat(tmp_path))
        assert child.silence(read_heartbeat(tmp_path), hang_timeout=0.0, startup_grace=60.0) == ""
    finally:
        child.kill()
        child.popen.wait()


def test_a_tick_whose_heartbeat_read_failed_keeps_the_beats_seen_before(tmp_path):
    """A tick's one reading of the heartbeat can fail (None); before, that tick judged the trainer by the start-up
    rule, as if it had never beaten, and killed a DPO reference pass beating every 0.25 s 37 s after its start
    (under load, in CI). The newest own beat seen stays the measure."""
    from minilmd.daemon.base.runstate import read_heartbeat

    child = launch([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path, 2, "")
    try:
        (tmp_path / names.HEARTBEAT).write_text("3\n")
        beat = read_heartbeat(tmp_path)
        assert child.beats(beat) and child.silence(beat, hang_timeout=60.0, startup_grace=0.0) == ""
        child.started -= 120  # long past any start-up grace: only the beat seen keeps it alive
        assert child.silence(None, hang_timeout=60.0, startup_grace=0.0) == ""
    finally:
        child.kill()
        child.popen.wait()


def test_a_trainer_killed_before_its_first_heartbeat_is_told_the_start_up_grace_not_the_configs_value(tmp_path):
    """Found by a new user: a trainer silent from its start was reported `no heartbeat for 60s (restart.hang_timeout
    60s)` under a config saying 30s; the 60 s are the start-up grace before a first heartbeat, and the message names
    both."""
    child = launch([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path, 2, "")
    try:
        detail = wait_until(lambda: child.silence(None, hang_timeout=0.0, startup_grace=1.0), 30, "the grace to pass")
        assert "1s start-up grace" in detail and "restart.hang_timeout 0s" in detail, detail
        (tmp_path / names.HEARTBEAT).write_text("3\n")  # its own heartbeat: hang_timeout alone from now on
        from minilmd.daemon.base.runstate import read_heartbeat

        beat = read_heartbeat(tmp_path)
        assert child.beats(beat)
        later = wait_until(lambda: child.silence(beat, hang_timeout=0.0, startup_grace=1.0), 30, "silence")
        assert "grace" not in later and "(restart.hang_timeout 0s)" in later, later
    finally:
        child.kill()
        child.popen.wait()
