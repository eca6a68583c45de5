"""The run-time side of tests/test_one_way_to_signal.py: os.kill, os.killpg, signal.pidfd_send_signal, pthread_kill
and raise_signal (and the same functions of the C modules posix and _signal behind them) are replaced, for the whole
test process, by watching ones; while a test runs (conftest.py's autouse fixture, `senders_watched`) they note every
call whose nearest caller of the project's code is outside minilmd/procs.py, and the fixture fails the test on one.
The static audit reads the source; this sees what it missed (a spelling it does not know, a library of ours handed a
pid).

They are replaced when this module is imported, which conftest.py does before it imports any module of the product:
a module that binds a sending function at its own import (`from os import kill`, `from signal import pthread_kill`,
`SEND = os.killpg`, a default argument, a table of functions) binds the watching one, however it spells the name.
Replaced only while a test ran (as before), such a name kept the original, bound at collection. Imported after a
module of the product, this module refuses to start (`imported_too_early`) rather than watch with a blind spot.

The caller is the nearest frame in the repository's minilmd/, daemon/, trainer/ or tests/: a test may signal (its
own children, a planted process), and so may the standard library for it (Popen.kill from a test goes through
subprocess.py first); a call with no frame of ours (a library's own thread) is not ours to judge. The call itself
is still made: the finding is reported at the test's end, where no `except Exception` in the code can swallow it.
"""
from __future__ import annotations

import _signal
import functools
import os
import posix
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
THE_MODULE = str(REPO / "minilmd" / "procs.py")
PRODUCT = tuple(f"{REPO / folder}{os.sep}" for folder in ("minilmd", "daemon", "trainer"))
OURS = (*PRODUCT, f"{REPO / 'tests'}{os.sep}")
ALLOWED = (THE_MODULE, f"{REPO / 'tests'}{os.sep}")
SENDERS = {os: ("kill", "killpg"), posix: ("kill", "killpg"),
           signal: ("pidfd_send_signal", "pthread_kill", "raise_signal"),
           _signal: ("pidfd_send_signal", "pthread_kill", "raise_signal")}
WATCHED = tuple((module, name) for module, names in SENDERS.items() for name in names if hasattr(module, name))

_watches: list[list[str]] = []
"""The findings list of each watch now open (the running test's)."""


def offending_caller() -> str | None:
    """"file:line" of the nearest caller of ours when it is neither procs.py nor a test, else None."""
    frame = sys._getframe(2)  # the caller of the wrapper
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(OURS):
            return None if name.startswith(ALLOWED) else f"{Path(name).relative_to(REPO)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _watching(send: Callable, what: str) -> Callable:
    @functools.wraps(send)
    def watched(*args, **kwargs):
        if _watches and (caller := offending_caller()) is not None:
            _watches[-1].append(f"{caller}: {what}{args!r}")
        return send(*args, **kwargs)
    return watched


def imported_too_early(modules: Mapping[str, object]) -> list[str]:
    """The modules of the product among `modules` (sys.modules): imported before the senders were replaced, they may
    hold an original under a name of their own."""
    return sorted(name for name, module in modules.items()
                  if str(getattr(module, "__file__", None) or "").startswith(PRODUCT))


def _install() -> None:
    early = imported_too_early(sys.modules)
    if early:
        raise RuntimeError("tests/signal_backstop.py must be imported before any module of the product (conftest.py "
                           "imports it first); already imported, and free to hold an unwatched os.kill: "
                           + ", ".join(early))
    for module, name in WATCHED:
        setattr(module, name, _watching(getattr(module, name), f"{module.__name__}.{name}"))


@contextmanager
def senders_watched() -> Iterator[list[str]]:
    """Yields the list of findings ("file:line: call") of the calls made meanwhile."""
    found: list[str] = []
    _watches.append(found)
    try:
        yield found
    finally:
        _watches.remove(found)


_install()
