"""The run-time side of tests/test_one_way_to_signal.py: while a test runs, os.kill, os.killpg,
signal.pidfd_send_signal, pthread_kill and raise_signal note every call whose nearest caller of the project's code
is outside minilmd/procs.py; conftest.py's autouse fixture fails the test on one. The static audit reads the
source; this sees what it missed (a spelling it does not know, a library of ours handed a pid).

The caller is the nearest frame in the repository's minilmd/, daemon/, trainer/ or tests/: a test may signal (its
own children, a planted process), and so may the standard library for it (Popen.kill from a test goes through
subprocess.py first); a call with no frame of ours (a library's own thread) is not ours to judge. The call itself
is still made: the finding is reported at the test's end, where no `except Exception` in the code can swallow it.
A module that bound a sending function at its import (`from os import kill`) keeps the original: the static audit
lists that spelling.
"""
from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
THE_MODULE = str(REPO / "minilmd" / "procs.py")
OURS = tuple(f"{REPO / folder}{os.sep}" for folder in ("minilmd", "daemon", "trainer", "tests"))
ALLOWED = (THE_MODULE, f"{REPO / 'tests'}{os.sep}")
WATCHED = ((os, "kill"), (os, "killpg"), (signal, "pidfd_send_signal"), (signal, "pthread_kill"),
           (signal, "raise_signal"))


def offending_caller() -> str | None:
    """"file:line" of the nearest caller of ours when it is neither procs.py nor a test, else None."""
    frame = sys._getframe(2)  # the caller of the wrapper
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(OURS):
            return None if name.startswith(ALLOWED) else f"{Path(name).relative_to(REPO)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _watching(send: Callable, what: str, found: list[str]) -> Callable:
    def watched(*args, **kwargs):
        caller = offending_caller()
        if caller is not None:
            found.append(f"{caller}: {what}{args!r}")
        return send(*args, **kwargs)
    return watched


@contextmanager
def senders_watched() -> Iterator[list[str]]:
    """The sending functions replaced by watching ones meanwhile; yields the list of findings ("file:line: call")."""
    found: list[str] = []
    originals = [(module, name, getattr(module, name)) for module, name in WATCHED]
    for module, name, send in originals:
        setattr(module, name, _watching(send, f"{module.__name__}.{name}", found))
    try:
        yield found
    finally:
        for module, name, send in originals:
            setattr(module, name, send)
