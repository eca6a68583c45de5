"""The contract between the trainer (a plain child process) and the supervisor.

The trainer reports through files in the run directory and through its exit status; nothing else. Each exit
status has one meaning and one restart rule (docs/failure-modes.md has the table). This module is torch-free:
the supervisor imports it.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

# --- Special token ids (MiniMind's): PAD <|endoftext|>, BOS <|im_start|>, EOS <|im_end|>. -----------------------
PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
SPECIAL_TOKENS = {"<|endoftext|>": PAD_ID, "<|im_start|>": BOS_ID, "<|im_end|>": EOS_ID}

# --- Exit statuses of `minilmd train` -----------------------------------------------------------------------------
EXIT_DONE = 0  # the budget is reached and the final checkpoint saved
EXIT_CRASH = 1  # an unexpected exception (traceback in the attempt log): restart with backoff
EXIT_CONFIG = 2  # the config is invalid: final, never restarted
EXIT_DATA = 65  # the input data is invalid (sysexits EX_DATAERR): final, never restarted
EXIT_STOPPED = 75  # stopped on request (SIGTERM), saved at a step boundary first (EX_TEMPFAIL)
EXIT_CUDA_OOM = 76  # CUDA ran out of memory; fault.json says where: wait for the GPU or halve the micro-batch

# --- Exit statuses of `minilmd run` (the supervisor) ------------------------------------------------------------
SUPERVISOR_DONE = 0  # the run finished, or was stopped on request with a synced checkpoint
SUPERVISOR_CONFIG = 2  # bad config, bad data or a run already owned by another supervisor: do not restart
SUPERVISOR_GAVE_UP = 79  # too many restarts, or too many without progress: do not restart (systemd prevents it)
FINAL_EXIT_STATUSES = (SUPERVISOR_CONFIG, EXIT_DATA, SUPERVISOR_GAVE_UP)

# --- Files in the run directory ---------------------------------------------------------------------------------
HEARTBEAT = "heartbeat"  # its mtime is refreshed every training step; its body is the current step
METRICS = "metrics.jsonl"  # one JSON line per logged step (and eval, and checkpoint save)
FAULT = "fault.json"  # written by the trainer just before it exits on a failure it can see
STATE = "state.json"  # the supervisor's view, rewritten atomically
EVENTS = "events.jsonl"  # one line per supervisor event
SUPERVISOR_LOG = "supervisor.log"
LOCK = "supervisor.lock"
ATTEMPT_LOGS = "logs"  # logs/attempt-0001.log ... one per trainer launch
RUN_CONFIG_COPY = "run.toml"

# --- Set by the supervisor on every child (daemon/child.py RUN_DIR_ENV): the trainer runs supervised. Then it
# neither prunes scratch checkpoints (the supervisor does, after a verified sync) nor reads the remote itself.
SUPERVISED_ENV = "MINILMD_RUN_DIR"

# --- Fault injection, for tests and the demo ----------------------------------------------------------------------
# MINILMD_FAULT="kind@step[,kind@step...]" with kind in FAULT_KINDS. Each fault fires once per run: the trainer
# records a fired fault in <run dir>/faults-fired so that a restarted trainer does not fire it again.
FAULT_ENV = "MINILMD_FAULT"
FAULT_KINDS = ("oom", "sigbus", "sigkill", "hang", "exception")
FAULTS_FIRED = "faults-fired"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks (corpus files and checkpoints can be GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in this directory durable (a file's own fsync does not cover its name)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a file so that a reader sees the old content or the new, never a half: temp file, fsync, rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_fault(run_dir: str | os.PathLike, kind: str, message: str, **details) -> None:
    """Leave a note for the supervisor about why the trainer is about to exit."""
    atomic_write_json(Path(run_dir) / FAULT, {"kind": kind, "message": message, **details})


def read_fault(run_dir: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(run_dir) / FAULT).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
