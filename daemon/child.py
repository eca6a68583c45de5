"""The trainer as a child process: how it is launched, watched, stopped, and what its end means.

The child runs in its own process group (so that a torchrun group is stopped as a whole and a terminal's ^C reaches
only the supervisor), writes to logs/attempt-NNNN.log, and carries MINILMD_RUN_DIR and a random MINILMD_LAUNCH_ID
in its environment. `launch()` records the trainer in <run dir>/trainer.json (pid, start time, uid, host, launch
id) before anything else can happen to the supervisor, so that a restarted supervisor and `minilmd stop` can tell
an orphan of this run in /proc from any other process: they signal only processes of our uid on this host that
carry this run's directory and launch id and started no earlier than the recorded trainer. Anyone can put
MINILMD_RUN_DIR in an environment; nobody else's process is ever signalled, even by root.

`classify()` turns an exit status into a `Death` with one `Cause` (daemon/states.py; CAUSES says what each means);
the restart policy (daemon/policy.py) acts on the cause. Nothing here waits for a child without a bound: a trainer in
uninterruptible I/O on a stalled mount may take long to die even after SIGKILL, and the supervisor's loop must go
on meanwhile. Torch-free.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from minilmd import names, protocol
from minilmd.daemon.runstate import process_alive, process_environ, process_start_ticks
from minilmd.daemon.states import Cause
from minilmd.fsio import atomic_write_json, tail_lines

RUN_DIR_ENV = names.RUN_DIR_ENV
"""Set on every child: the absolute run directory. How an orphaned trainer is recognised after a supervisor crash."""
LAUNCH_ID_ENV = names.LAUNCH_ID_ENV
"""Set on every child: a random token per launch, also in trainer.json; its processes inherit it."""
TRAINER_CMD_ENV = names.TRAINER_CMD_ENV
"""Replaces `python -m minilmd.cli` in the child's command line (tests use a fake trainer through it)."""

SUPERVISOR_LINE = "# "
"""How the lines the supervisor itself writes into an attempt log begin (the header, a stack dump's header)."""
REAP_S = 10.0
"""After SIGKILL, how long kill_group waits for the kernel to let the process go before it gives up on reaping it."""

CAUSES: dict[Cause, str] = {
    Cause.DONE: "the trainer reached its budget and saved the final checkpoint (exit 0)",
    Cause.STOPPED: "the trainer saved and exited on SIGTERM (exit 75)",
    Cause.CONFIG_ERROR: "the trainer refused the config (exit 2): final",
    Cause.DATA_ERROR: "the trainer refused the data (exit 65): final",
    Cause.CUDA_OOM: "CUDA ran out of memory (exit 76, fault.json)",
    Cause.SIGBUS: "SIGBUS: a page of a mapped file could not be read (staged corpus or checkpoint damaged?)",
    Cause.OOM_KILL: "SIGKILL by the kernel's OOM killer (cgroup memory events or kernel log)",
    Cause.KILLED: "SIGKILL from outside (probably the OOM killer; its log was not readable)",
    Cause.HANG: "no heartbeat for restart.hang_timeout: stack dumped, group killed",
    Cause.SIGNAL: "killed by another signal",
    Cause.CRASH: "exited with an error (traceback in the attempt log)",
    Cause.SCRATCH_FULL: "a checkpoint did not fit in scratch (exit 74, fault.json says needs and free)",
}


@dataclass
class Death:
    cause: Cause
    exit: int | None
    detail: str
    fault: dict | None = None


def attempt_log_path(run_dir: Path, attempt: int) -> Path:
    return run_dir / names.ATTEMPT_LOGS / names.attempt_log_name(attempt)


def trainer_prefix() -> list[str]:
    custom = os.environ.get(TRAINER_CMD_ENV)
    if custom:
        return shlex.split(custom)
    return [sys.executable, "-m", "minilmd.cli"]


def build_command(config_copy: Path, overrides: dict[str, object], nproc: int = 1) -> list[str]:
    """`minilmd train RUN.TOML --set K=V ...`, under torchrun (its own restarts off: the supervisor restarts the
    whole group) when more than one GPU is used."""
    sets: list[str] = []
    for key, value in overrides.items():
        sets += ["--set", f"{key}={_toml_literal(value)}"]
    if nproc > 1:
        # `python -m torch.distributed.run` is torchrun without depending on the script being on PATH.
        prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                  "--max-restarts", "0", "-m", "minilmd.cli"]
    else:
        prefix = trainer_prefix()
    return [*prefix, "train", str(config_copy), *sets]


def _toml_literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class Child:
    """A launched trainer. `pid` is also its process group id."""

    popen: subprocess.Popen
    attempt: int
    log_path: Path
    command: list[str]
    started: float
    start_ticks: int | None
    newest_at_launch: int = -1  # the newest local checkpoint step at launch: a newer one is progress
    cgroup_oom: tuple[Path, int] | None = None  # (oom counter file, its value when first seen)
    killed_for_hang: bool = False
    hang_detail: str = ""
    stop_sent: float | None = None
    killed_at: float | None = None  # when kill() sent SIGKILL; the loop then only polls until it is reaped
    reap_reported: bool = False  # the loop said once that the kernel has not let it go yet

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def track_cgroup(self) -> None:
        """Remember the OOM-kill counter of the child's memory cgroup, re-read whenever the child moves to another
        cgroup, so that a kill can be attributed to the OOM killer afterwards."""
        counter = oom_counter_file(self.pid)
        if counter and (self.cgroup_oom is None or self.cgroup_oom[0] != counter):
            value = read_oom_kills(counter)
            if value is not None:
                self.cgroup_oom = (counter, value)

    def beats(self, beat: tuple[float, int | None] | None) -> bool:
        """Whether the heartbeat file (`runstate.read_heartbeat`) was written by this attempt."""
        return beat is not None and beat[0] >= self.started - 1

    def silence(self, beat: tuple[float, int | None] | None, hang_timeout: float, startup_grace: float) -> str:
        """Why the trainer counts as hung, or "": no heartbeat of its own for hang_timeout; before its first one
        (imports, corpus open and checkpoint load come first) for max(hang_timeout, startup_grace)."""
        own_beat = beat[0] if beat is not None and self.beats(beat) else None
        limit = hang_timeout if own_beat is not None else max(hang_timeout, startup_grace)
        silent = time.time() - max(self.started, own_beat if own_beat is not None else 0.0)
        if silent <= limit:
            return ""
        return f"no heartbeat for {silent:.0f}s (restart.hang_timeout {limit:.0f}s)"

    def kill(self) -> None:
        """SIGKILL to the whole group; the caller polls for the end (it may come late: uninterruptible I/O)."""
        if self.killed_at is None:
            self.killed_at = time.time()
        self.signal_group(signal.SIGKILL)

    def kill_group(self, grace: float = 0.0, reap_s: float = REAP_S, while_waiting=None) -> int | None:
        """SIGTERM (if grace > 0) and up to grace for the group to exit, then SIGKILL and up to reap_s for the kernel
        to release it. The exit status, or None if it is still not reaped (the kernel holds it in uninterruptible
        I/O): never a wait without a bound. `while_waiting()` is called every few tens of milliseconds (the
        systemd watchdog)."""
        if grace > 0:
            self.signal_group(signal.SIGTERM)
            rc = wait_bounded(self.popen, grace, while_waiting)
            if rc is not None:
                return rc
        self.kill()
        return wait_bounded(self.popen, reap_s, while_waiting)


def wait_bounded(popen, seconds: float, while_waiting=None, interval: float = 0.05) -> int | None:
    """The exit status of popen once it ends within `seconds`, else None; polls, never a blocking wait."""
    deadline = time.monotonic() + seconds
    while True:
        rc = popen.poll()
        if rc is not None or time.monotonic() >= deadline:
            return rc
        if while_waiting is not None:
            while_waiting()
        time.sleep(interval)


def launch(command: list[str], run_dir: Path, attempt: int, devices: str, extra_env: dict | None = None) -> Child:
    """Start the trainer in its own session, output appended to its attempt log."""
    log_path = attempt_log_path(run_dir, attempt)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(extra_env or {})
    env[RUN_DIR_ENV] = str(run_dir.resolve())
    env[LAUNCH_ID_ENV] = record_launch(run_dir, attempt)
    env["CUDA_VISIBLE_DEVICES"] = devices
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    with open(log_path, "ab") as log:
        log.write(f"# attempt {attempt}: {shlex.join(command)}\n# CUDA_VISIBLE_DEVICES={devices!r}\n".encode())
        log.flush()
        popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True, close_fds=True)
    child = Child(popen=popen, attempt=attempt, log_path=log_path, command=command, started=time.time(),
                  start_ticks=process_start_ticks(popen.pid))
    record_launch(run_dir, attempt, env[LAUNCH_ID_ENV], child.pid, child.start_ticks)
    child.track_cgroup()
    return child


# --- classification --------------------------------------------------------------------------------------------

def classify(child: Child, returncode: int, run_dir: Path, stop_requested: bool) -> Death:
    """One cause for an ended child. fault.json (the trainer's own note) is consumed here."""
    fault = _own_fault(run_dir, child.started)
    rc = returncode
    if child.killed_for_hang:
        return Death(Cause.HANG, rc, child.hang_detail or "no heartbeat", fault)
    sig = -rc if rc < 0 else None
    if rc == 1 and "torch.distributed.run" in child.command:
        sig = _torchrun_worker_signal(child.log_path)  # torchrun exits 1 whatever killed a worker
    if sig == signal.SIGBUS:
        return Death(Cause.SIGBUS, rc, "killed by SIGBUS (bus error on a mapped file)", fault)
    if sig == signal.SIGKILL:
        if child.cgroup_oom:
            counter, before = child.cgroup_oom
            after = read_oom_kills(counter)
            if after is not None and after > before:
                return Death(Cause.OOM_KILL, rc, f"SIGKILL by the OOM killer ({counter}: oom_kill {before} -> {after})",
                             fault)
        if _kernel_log_oom(child.pid):
            return Death(Cause.OOM_KILL, rc, f"SIGKILL by the OOM killer (kernel log names pid {child.pid})", fault)
        return Death(Cause.KILLED, rc, "killed by SIGKILL (probably the OOM killer; no readable OOM record)", fault)
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return Death(Cause.SIGNAL, rc, f"killed by {name}", fault)
    if rc == protocol.EXIT_DONE:
        return Death(Cause.DONE, rc, "finished", fault)
    if rc == protocol.EXIT_STOPPED:
        who = "on request" if stop_requested else "on a SIGTERM the supervisor did not send"
        return Death(Cause.STOPPED, rc, f"saved and stopped {who}", fault)
    if rc == protocol.EXIT_CONFIG:
        return Death(Cause.CONFIG_ERROR, rc, _last_lines(child.log_path) or "config error", fault)
    if rc == protocol.EXIT_DATA:
        return Death(Cause.DATA_ERROR, rc, _last_lines(child.log_path) or "data error", fault)
    if rc == protocol.EXIT_SCRATCH_FULL or (fault or {}).get("kind") == "scratch_full":
        return Death(Cause.SCRATCH_FULL, rc, (fault or {}).get("message", "scratch full"), fault)
    if rc == protocol.EXIT_CUDA_OOM or (fault or {}).get("kind") == "cuda_oom":
        return Death(Cause.CUDA_OOM, rc, (fault or {}).get("message", "CUDA out of memory"), fault)
    detail = (fault or {}).get("message") or _last_lines(child.log_path) or f"exit status {rc}"
    return Death(Cause.CRASH, rc, detail, fault)


def _own_fault(run_dir: Path, started: float) -> dict | None:
    """fault.json if this attempt wrote it (a stale one from an earlier attempt is ignored); consumed."""
    path = run_dir / names.FAULT
    try:
        fresh = path.stat().st_mtime >= started - 1
    except FileNotFoundError:
        return None
    fault = protocol.read_fault(run_dir) if fresh else None
    path.unlink(missing_ok=True)
    return fault


def _last_lines(path: Path, n: int = 3, limit: int = 400) -> str:
    """The trainer's last words: up to n of its last lines, whole, joined by " | " within `limit` characters. The
    supervisor's own lines in the log (they start with "# ": the attempt header, a stack dump's header) are not the
    trainer's words. A last line longer than the limit keeps its start, cut after a word and marked " …"."""
    try:
        lines = [ln.strip() for ln in tail_lines(path, 50, max_bytes=8192)[0]]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and not ln.startswith(SUPERVISOR_LINE)][-n:]
    if not lines:
        return ""
    kept = [lines.pop()]
    while lines and len(" | ".join([lines[-1], *kept])) <= limit:
        kept.insert(0, lines.pop())
    text = " | ".join(kept)
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 1)
    return text[:cut if cut > 0 else limit - 2] + " …"


def _torchrun_worker_signal(log_path: Path) -> int | None:
    try:
        tail = "\n".join(tail_lines(log_path, 1 << 20, max_bytes=16384)[0])
    except OSError:
        return None
    m = re.findall(r"exitcode\s*:\s*-(\d+)", tail)
    return int(m[-1]) if m else None


def oom_counter_file(pid: int) -> Path | None:
    """The file whose `oom_kill N` line counts OOM kills in the process's memory cgroup (v2 or v1)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if "memory" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/memory") / rel / "memory.oom_control"
            if candidate.exists():
                return candidate
        if controllers == "":
            for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                candidate = base / rel / "memory.events"
                if candidate.exists():
                    return candidate
    return None


def read_oom_kills(counter: Path) -> int | None:
    try:
        for line in counter.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _kernel_log_oom(pid: int) -> bool:
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(rf"Killed process {pid}\b", out) is not None or \
        re.search(rf"oom-kill:.*pid={pid}\b", out) is not None


# --- hangs and orphans -----------------------------------------------------------------------------------------

DUMP_WAIT_S = 3.0
"""After SIGUSR1, how long dump_stack waits for the faulthandler's dump to reach the attempt log."""
_DUMP_MARK = b"(most recent call first):"  # faulthandler's line above each thread's stack


def dump_stack(pid: int, log_path: Path, timeout: float = 20.0, torchrun: bool = False,
               wait_s: float = DUMP_WAIT_S) -> str:
    """Put the hung child's Python stacks into its attempt log and say what actually got there: with py-spy if
    installed, else SIGUSR1 to each process of the child's group that catches it (`minilmd train` registers its
    faulthandler for SIGUSR1, writing to stderr, which is this log; torchrun does not catch it and is left alone, its
    workers are dumped). A process that does not catch SIGUSR1 yet (still importing) would die of it, so it is not
    sent; one in uninterruptible I/O (state D, a stalled mount) runs no handler until the I/O returns, so nothing may
    come: the answer then says so, with the process state and where the kernel holds it."""
    py_spy = shutil.which("py-spy")
    if py_spy:
        try:
            out = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                                 timeout=timeout)
        except (OSError, subprocess.SubprocessError) as e:
            failed = f"py-spy failed: {e}"
        else:
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"\n{SUPERVISOR_LINE}py-spy dump --pid {pid} (hang detected by the supervisor)\n"
                          f"{out.stdout}{out.stderr}\n")
            if out.returncode == 0:
                return "py-spy dumped the stacks into the attempt log"
            failed = f"py-spy exit {out.returncode}"
        return f"{failed}; {_dump_by_sigusr1(pid, log_path, wait_s, torchrun)}"
    return _dump_by_sigusr1(pid, log_path, wait_s, torchrun)


def _dump_by_sigusr1(pid: int, log_path: Path, wait_s: float, torchrun: bool) -> str:
    group = _group_members(pid)
    targets = [p for p in group if _catches(p, signal.SIGUSR1)]
    if not targets:
        who = "its torchrun workers do" if torchrun else "it does"
        return (f"no stack dump: {who} not catch SIGUSR1 yet (the faulthandler is registered when training starts; "
                f"a hang in imports or start-up comes before), so SIGUSR1 would only kill {_states(group or [pid])}")
    with open(log_path, "ab") as log:
        log.write(f"\n{SUPERVISOR_LINE}hang: SIGUSR1 to pid {', '.join(map(str, targets))}: their faulthandler "
                  f"dumps every thread's stack below\n".encode())
    start = _size(log_path)
    for target in targets:
        try:
            os.kill(target, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    dumped = _wait_for_dump(log_path, start, wait_s)
    if dumped:
        threads, lines = dumped.count(_DUMP_MARK), dumped.count(b"\n")
        return f"SIGUSR1: the faulthandler dumped {threads} thread stack(s) ({lines} lines) into the attempt log"
    states = _states(targets)
    with open(log_path, "ab") as log:
        log.write(f"{SUPERVISOR_LINE}hang: no stack dump within {wait_s:g}s of SIGUSR1; {states}\n".encode())
        for target in targets:
            kernel = _kernel_stack(target)
            if kernel:
                log.write(f"{SUPERVISOR_LINE}kernel stack of pid {target} (/proc/{target}/stack):\n{kernel}".encode())
    return (f"SIGUSR1 sent but no stack dump reached the attempt log within {wait_s:g}s: {states} (a process in "
            f"uninterruptible I/O runs no handler until the I/O returns)")


def _wait_for_dump(log_path: Path, start: int, wait_s: float, interval: float = 0.05) -> bytes:
    """What the log gained after `start` once it holds a stack and has stopped growing, or b"" after wait_s."""
    deadline = time.monotonic() + wait_s
    seen = b""
    while time.monotonic() < deadline:
        time.sleep(interval)
        with open(log_path, "rb") as log:
            log.seek(start)
            now_seen = log.read(1 << 20)
        if _DUMP_MARK in now_seen and now_seen == seen:
            return now_seen
        seen = now_seen
    return seen if _DUMP_MARK in seen else b""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first), or [] if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return raw[raw.rfind(")") + 2:].split()


def _group_members(pgid: int) -> list[int]:
    """The live processes of process group pgid (the child's session leader first)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _proc_stat(int(entry))
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry))
    return sorted(members, key=lambda p: p != pgid)


def _catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for sig (SigCgt of /proc/PID/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _states(pids: list[int]) -> str:
    """"pid 12 state D (waiting in nfs_wait_on_request)" for each pid: where each one is."""
    parts = []
    for pid in pids:
        fields = _proc_stat(pid)
        if not fields:
            parts.append(f"pid {pid} gone")
            continue
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        except OSError:
            wchan = ""
        where = f" (waiting in {wchan})" if wchan and wchan != "0" else ""
        parts.append(f"pid {pid} state {fields[0]}{where}")
    return ", ".join(parts)


def _kernel_stack(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stack").read_text()
    except OSError:
        return ""


# --- which processes are this run's -------------------------------------------------------------------------

def record_launch(run_dir: Path, attempt: int, launch_id: str | None = None, pid: int | None = None,
                  start_ticks: int | None = None) -> str:
    """Write trainer.json: written once before the launch (a supervisor killed during Popen still leaves the launch
    id, uid and host) and again with the trainer's pid and start time. Returns the launch id."""
    launch_id = launch_id or secrets.token_hex(16)
    atomic_write_json(run_dir / names.TRAINER_RECORD,
                      {"launch_id": launch_id, "uid": os.getuid(), "host": socket.gethostname(), "attempt": attempt,
                       "pid": pid, "start_ticks": start_ticks, "time": time.time()})
    return launch_id


def _read_record(run_dir: Path) -> dict | None:
    """trainer.json if it names a trainer that this user launched on this host, else None."""
    try:
        record = json.loads((run_dir / names.TRAINER_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("launch_id"), str) or not record["launch_id"]:
        return None
    if record.get("uid") != os.getuid() or record.get("host") != socket.gethostname():
        return None
    return record


def process_uids(pid: int) -> tuple[int, ...] | None:
    """(real, effective, saved, filesystem) uids of a process, from /proc/PID/status; None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return tuple(int(u) for u in line.split()[1:])
    except (OSError, ValueError):
        return None
    return None


def is_ours(pid: int) -> bool:
    """Whether every uid of the process is ours: a process of another user is never signalled, even by root."""
    uids = process_uids(pid)
    return uids is not None and set(uids) == {os.getuid()}


def _orphans(run_dir: Path) -> list[tuple[int, int]]:
    """(pid, start ticks) of each live process of the recorded trainer: ours, carrying this run's directory and the
    recorded launch id, started no earlier than the trainer (the trainer itself: its pid and start time)."""
    record = _read_record(run_dir)
    if record is None:
        return []
    target, launch_id = str(run_dir.resolve()), record["launch_id"]
    leader, leader_ticks = record.get("pid"), record.get("start_ticks")
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        ticks = process_start_ticks(pid)
        if ticks is None or not is_ours(pid):
            continue
        if isinstance(leader_ticks, int) and (ticks < leader_ticks or (pid == leader and ticks != leader_ticks)):
            continue
        env = process_environ(pid)
        if env.get(RUN_DIR_ENV) != target or env.get(LAUNCH_ID_ENV) != launch_id:
            continue
        if process_start_ticks(pid) == ticks:  # still the process all of the above was read from
            found.append((pid, ticks))
    return sorted(found)


def find_orphans(run_dir: Path) -> list[int]:
    """Pids of live processes of the trainer this run launched last (trainer.json), other than us: the trainer and
    what it started. Never another user's process, nor one that merely carries MINILMD_RUN_DIR=<run dir>."""
    return [pid for pid, _ in _orphans(run_dir)]


def terminate_orphans(run_dir: Path, grace: float = 30.0, while_waiting=None) -> list[int]:
    """SIGTERM each process of find_orphans(run_dir) (the trainer saves and exits), then SIGKILL what is left after
    grace, and whatever of the trainer's appeared meanwhile. They are not our children (their parent died), so we
    poll /proc instead of waiting. Each process is signalled by itself, through a pidfd opened and checked against
    its start time first: never a recycled pid, never a whole group that may hold another user's process. The grace
    can outlast systemd's WatchdogSec: `while_waiting()` is called at every poll (the supervisor pings the watchdog
    there). Returns the pids that were alive."""
    alive = _orphans(run_dir)
    for pid, ticks in alive:
        signal_process(pid, ticks, signal.SIGTERM)
    _poll_until_gone(alive, grace, 0.1, while_waiting)
    late = [p for p in _orphans(run_dir) if p not in alive]
    for pid, ticks in [*alive, *late]:
        if process_alive(pid, ticks):
            signal_process(pid, ticks, signal.SIGKILL)
    _poll_until_gone([*alive, *late], REAP_S, 0.05, while_waiting)
    return [pid for pid, _ in alive]


def _poll_until_gone(alive: list[tuple[int, int]], seconds: float, interval: float, while_waiting) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(process_alive(p, t) for p, t in alive):
        if while_waiting is not None:
            while_waiting()
        time.sleep(interval)


def signal_process(pid: int, ticks: int | None, sig: int) -> bool:
    """Signal the process `pid` that started at `ticks` (None: whichever has that pid now), if it is still that one
    and ours: through a pidfd opened before the check, so that a pid recycled in between is never hit. Whether the
    signal was sent."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:
        fd = None  # no pidfd here (a kernel before 5.3): a check and a kill, with the tiny window that leaves
    try:
        if (ticks is not None and process_start_ticks(pid) != ticks) or not is_ours(pid):
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd is not None:
            os.close(fd)
