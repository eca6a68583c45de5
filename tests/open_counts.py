"""How many times each file of a checkpoint is opened by a command that reads it (a resume, an export, a sample):
the `opens` fixture counts every open by absolute path, and `each_once` asserts each file of a checkpoint opened
exactly once (tests/test_validate_once.py, tests/test_resume_reads_once.py). A test module imports the fixture by
name to use it."""
from __future__ import annotations

import builtins
import collections
import io
import os
from pathlib import Path

import pytest

from minilmd import names

CHECKPOINT_FILES = (names.MANIFEST, names.MODEL_FILE, names.OPTIMIZER_FILE, names.OPTIMIZER_META,
                    names.TRAINER_STATE)


@pytest.fixture
def opens(monkeypatch) -> collections.Counter:
    """How many times each file is opened, by absolute path: every reader of a checkpoint opens through os.open
    (untrusted.open_regular) or open(); a fake around both counts them."""
    counted: collections.Counter = collections.Counter()
    real_os_open, real_open = os.open, builtins.open

    def os_open(path, *args, **kwargs):
        counted[os.path.abspath(os.fsdecode(path))] += 1
        return real_os_open(path, *args, **kwargs)

    def py_open(file, *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)):
            counted[os.path.abspath(os.fsdecode(file))] += 1
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", py_open)
    monkeypatch.setattr(io, "open", py_open)
    return counted


def each_once(opens: collections.Counter, ckpt: Path) -> None:
    assert {name: opens[str(ckpt.absolute() / name)] for name in CHECKPOINT_FILES} == \
        dict.fromkeys(CHECKPOINT_FILES, 1)
