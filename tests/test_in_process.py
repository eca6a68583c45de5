"""tests/in_process.py: `minilmd train` in the test's process gives back what it sets for its whole process, and
refuses a fault that would end the test's process."""
from __future__ import annotations

import faulthandler
import gc
import os
import signal
from pathlib import Path

import pytest
import torch

from in_process import SDPA_BACKENDS, train_in_process
from minilmd.names import CUBLAS_WORKSPACE_ENV, FAULT_ENV
from minilmd.protocol import EXIT_DONE
from trainer_corpus import modules_after, read_metrics, run_paths, write_config


def process_wide() -> dict:
    return {"environ": dict(os.environ), "cwd": os.getcwd(), "umask": os.umask(os.umask(0o022)),
            "handlers": {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)},
            "faulthandler": faulthandler.is_enabled(), "threads": torch.get_num_threads(),
            "rng": torch.get_rng_state(), "gc_frozen": gc.get_freeze_count(),
            "sdpa": [getattr(torch.backends.cuda, f"{name}_enabled")() for name in SDPA_BACKENDS]}


@pytest.mark.slow
def test_a_run_here_trains_and_gives_back_the_process_wide_settings(tmp_path, corpus):
    # a forced kernel: the run switches the other attention backends off for its process
    config = write_config(tmp_path, corpus, model={"attention": "math"}, train={"max_steps": 2, "checkpoint_every": 2})
    os.environ.pop(CUBLAS_WORKSPACE_ENV, None)  # the trainer sets it (trainer/loop/determinism.py)
    before = process_wide()
    done = train_in_process(config)
    assert done.returncode == EXIT_DONE, done.stderr
    assert "torch threads" in done.stdout  # its stdout is captured
    assert [m["step"] for m in read_metrics(run_paths(config)[0], "train")] == [1, 2]
    after = process_wide()
    assert after.pop("rng").equal(before.pop("rng"))
    # nothing frozen by the run (the trainer freezes all that lives after its first step); objects an earlier test
    # froze may be freed meanwhile, so the count may fall, never grow
    assert after.pop("gc_frozen") <= before.pop("gc_frozen")
    assert after == before


def test_a_fault_that_ends_its_process_is_refused(tmp_path, corpus):
    config = write_config(tmp_path, corpus)
    for fault in ("sigkill@1", "sigbus@1", "hang@1"):
        with pytest.raises(ValueError, match="ends the process it fires in"):
            train_in_process(config, **{FAULT_ENV: fault})
    assert not run_paths(config)[0].exists()


@pytest.mark.slow  # a fresh interpreter: in a pytest worker another test may have imported the compiler already
def test_a_run_here_and_its_restore_never_import_torchs_compiler(tmp_path, corpus):
    """The restore once called torch.use_deterministic_algorithms unconditionally, which imports torch._inductor and
    torch._dynamo: a CPU-second in every pytest worker that the trainer itself (EagerAdamW) no longer pays."""
    config = write_config(tmp_path, corpus, name="eager", train={"max_steps": 1, "checkpoint_every": 1})
    code, modules, proc = modules_after(tmp_path, f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                                                  "from in_process import train_in_process\n"
                                                  f"code = train_in_process({str(config)!r}).returncode")
    assert code == EXIT_DONE, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "minilmd.trainer.loop.components" in modules  # it did train
    assert not [m for m in modules if m.startswith("torch._dynamo")], proc.stderr[-2000:]
