"""Another user on this machine, made of a uid no user has (STRANGER): his processes try a run's lock files in
tests/test_lock_files_private.py and tests/test_lock_stranger_guard.py. Needs root; PYTHON is a Python that uid can
run (the tests' own may lie under root's 0700 home), None where there is none (the tests skip then)."""
from __future__ import annotations

import os
import subprocess
import sys

STRANGER = 4242
"""A uid no user has: the other user."""


def as_stranger() -> None:
    """preexec_fn of a child that runs as the stranger, with no group of ours."""
    os.setgroups([])
    os.setgid(STRANGER)
    os.setuid(STRANGER)


def _strangers_python() -> str | None:
    for python in ("/usr/bin/python3", "/usr/local/bin/python3", os.path.realpath(sys.executable)):
        try:
            ran = subprocess.run([python, "-I", "-S", "-c", "print('ok')"], capture_output=True, text=True,
                                 preexec_fn=as_stranger, timeout=60)
        except OSError:
            continue
        if ran.stdout.strip() == "ok":
            return python
    return None


PYTHON = _strangers_python() if os.geteuid() == 0 else None
NEEDS = "needs root, and a Python another uid can run"
