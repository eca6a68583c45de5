"""`minilmd train` run in the test's own process: the command line's own code (minilmd/cli/trainer.train_command),
without the imports a new Python pays first (about 3 CPU-s each: torch and the rest, on a 2-core CI machine).

For the tests that ask what a run computes, writes or refuses (a loss, an exit status, a checkpoint, a resume's
bit-exactness where nothing is killed). Never for those about processes and signals (a kill, SIGBUS, a hang, a
supervisor): they start `minilmd train` for real (trainer_corpus.train), and an injected fault that would kill or
stop the test's process is refused here.

What the trainer sets for its whole process, as it should in a process of its own, is given back after it, so that
no test sees another's: os.environ (the cuBLAS workspace, the compile caches, the fault spec), the working
directory, the umask, every signal handler (its stop flag's SIGTERM and SIGINT), faulthandler (on, writing to the
command's stderr, and registered on SIGUSR1), torch's threads, its deterministic flags, its attention backends'
switches and its RNG, Python's and NumPy's RNGs. Its stdout and stderr are captured at the file descriptors
(faulthandler needs a real one) and returned as subprocess.run's are.
"""
from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from minilmd import trainer_lock
from minilmd.names import FAULT_ENV
from minilmd.trainer.loop.faults import parse_faults
from trainer_corpus import child_env, train_cmd

SDPA_BACKENDS = ("flash_sdp", "mem_efficient_sdp", "math_sdp", "cudnn_sdp")
"""torch's process-wide switches of the attention backends, which a run with a forced kernel sets (the CPU's SDPA
reads them too): torch.backends.cuda.<name>_enabled() and enable_<name>()."""
OWN_PROCESS_FAULTS = {"sigkill", "sigbus", "hang"}
"""Injected faults that end or stop the process they fire in: only a trainer of its own may take them."""


def train_in_process(config: Path, *sets: str, **env) -> subprocess.CompletedProcess:
    """trainer_corpus.train's result (returncode, stdout, stderr) for `minilmd train config --set ...` run here,
    with `env` added to the environment (as child_env builds a child's) for the run only."""
    faults = {f.kind for f in parse_faults(env.get(FAULT_ENV, ""))}
    if faults & OWN_PROCESS_FAULTS:
        raise ValueError(f"{FAULT_ENV}={env[FAULT_ENV]} ends the process it fires in: use trainer_corpus.train")
    with _process_state_restored(), _environment(child_env(**env)), _captured() as said:
        code = _run_command(str(config), list(sets))
    return subprocess.CompletedProcess(train_cmd(config, *sets), code, *said)


def _run_command(config: str, sets: list[str]) -> int:
    """The exit status `python -m minilmd.cli train` would end with; an escaping exception is 1 with its traceback
    on stderr, as Python's own exit says it."""
    import typer

    from minilmd import pychild
    from minilmd.cli.trainer import train_command

    pychild.guard_descendants()  # what minilmd.cli.main does before any command
    try:
        train_command(config, sets)
    except typer.Exit as e:
        return e.exit_code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the uncaught exception of a real process: status 1, traceback said
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    before = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


@contextlib.contextmanager
def _captured() -> Iterator[list[str]]:
    """The command's fds 1 and 2 (and sys.stdout, sys.stderr on them) in two temporary files; yields a list that
    holds their texts, stdout then stderr, once the block has ended."""
    said: list[str] = []
    with tempfile.TemporaryFile("w+", encoding="utf-8") as out, tempfile.TemporaryFile("w+", encoding="utf-8") as err:
        saved_fds = os.dup(1), os.dup(2)
        saved_streams = sys.stdout, sys.stderr
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False, buffering=1)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)
        try:
            yield said
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            for f in (out, err):
                f.seek(0)
                said.append(f.read())


def _signals() -> list[signal.Signals]:
    return [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


def _deterministic_flags() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


@contextlib.contextmanager
def _process_state_restored() -> Iterator[None]:
    cwd = os.getcwd()
    umask = os.umask(0o022)
    os.umask(umask)
    handlers = {s: signal.getsignal(s) for s in _signals()}
    fault_enabled = faulthandler.is_enabled()
    threads = torch.get_num_threads()
    deterministic = _deterministic_flags()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    sdpa = {name: getattr(torch.backends.cuda, f"{name}_enabled")() for name in SDPA_BACKENDS}
    rng = torch.get_rng_state(), random.getstate(), np.random.get_state()
    running = set(threading.enumerate())
    freeze = gc.freeze  # the trainer freezes what lives after its first step (train.py): in the test's process
    gc.freeze = lambda: None  # that would be its model and the worker's garbage, for good (unfreeze takes all)
    try:
        yield
    finally:
        trainer_lock.release_all()  # a trainer's own process lets it go when it exits
        gc.freeze = freeze
        os.chdir(cwd)
        os.umask(umask)
        for sig, handler in handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        if hasattr(signal, "SIGUSR1"):
            faulthandler.unregister(signal.SIGUSR1)
        faulthandler.disable()  # it wrote to the command's stderr, a file now closed
        if fault_enabled:
            faulthandler.enable(file=sys.__stderr__)
        torch.set_num_threads(threads)
        if _deterministic_flags() != deterministic:  # only on CUDA does the trainer turn them on (determinism.py)
            # set only when changed: torch.use_deterministic_algorithms imports torch._inductor, and with it
            # torch._dynamo, about a CPU-second the first time in each pytest worker that the trainer itself avoids
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        for name, enabled in sdpa.items():
            getattr(torch.backends.cuda, f"enable_{name}")(enabled)
        torch.set_rng_state(rng[0])
        random.setstate(rng[1])
        np.random.set_state(rng[2])
        left = [t for t in threading.enumerate() if t not in running and t.is_alive() and not t.daemon]
        assert not left, f"the trainer left threads running in the test's process: {left}"
