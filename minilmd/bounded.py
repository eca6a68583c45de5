"""A check of shared storage (NFS) in a thread, bounded: a mount that fails or stalls is not a config error (staging
and sync retry it and show it in status), so it answers nothing rather than a traceback or a hang. A check that
raises anything else did answer: what it raised is said as what it is (`Raised`), never as a stall, and no thread
traceback is printed (hostile audit 8 F4: another user's .pth crashed `run --check`'s init probe, printed a
traceback, then "OK", then "stalled"); to a caller that drops it, in one line on stderr (`say_raised`). Used by the
config checks (minilmd/probes.py, path_checks.py) and by the launch's looks at the remote (daemon/jobs). Torch-free.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from minilmd.untrusted import clipped, printable

SHARED_STORAGE_PROBE_S = 5.0
"""How long the config check waits for the corpus source, the remote or init.from (NFS) to answer before leaving it
to staging and sync, which retry and show "remote unavailable" (init.from: "init source unreachable", or stalled)
in status."""

SLOW_PROBE_S = 1.0
"""How long a look waits before a caller that asks (bounded_probe's `on_slow`) says what it waits on: a healthy
share answers well within it; one that has not is told at once, not after the whole wait in silence."""


class Raised(str):
    """bounded_probe's `why` when the check raised something other than an OSError (a ValueError of a hostile file,
    a bug): "failed (TYPE: what it said)". It answered, so it is no stall and nothing to wait for: a caller that
    refuses says it (isinstance), one that only looks says it as any other failure."""


class Stalled(str):
    """bounded_probe's `why` when the check did not answer in time (a stalled mount), as against one that failed."""


def raised(e: Exception) -> Raised:
    return Raised(f"failed ({type(e).__name__}: {clipped(printable(str(e)), 300)})")


def shared_storage_check(check, *args) -> list[str]:
    """Run a path check on shared storage (NFS) in a thread: a mount that fails (EIO) or stalls is not a config
    error (the supervisor retries it and shows it in status), so it yields no problem here rather than a
    traceback or a hang."""
    answered, result, _ = bounded_probe(check, *args)
    return result if answered else []


_UNANSWERED: dict[object, threading.Thread] = {}
"""bounded_probe's looks under a `key` that have not answered yet (their threads, left behind), by key."""
_UNANSWERED_LOCK = threading.Lock()


def bounded_probe(fn, *args, timeout_s: float | None = None, says_why: bool = False,
                  on_slow: Callable[[float], None] | None = None, key: object = None) -> tuple[bool, Any, str]:
    """fn(*args) on shared storage, in a thread for `timeout_s` (None: SHARED_STORAGE_PROBE_S) at most: (True, its
    result, "") when it returned; (False, None, why) when it raised an OSError or did not answer (a stalled mount:
    the thread is left behind, a daemon); (False, None, a `Raised`) when it raised anything else. A `Raised` is also
    said in one line on stderr (`say_raised`), unless the caller `says_why` itself: most callers take any failure as
    no answer and drop `why`, which would turn a bug into a silent "not answered" (review10b F2). `on_slow(s)`: called
    once, with the seconds the look may still take, when it has not answered within SLOW_PROBE_S. `key`, for a look
    repeated while it may stall (each retry of a wait): while an earlier look under the same key has not answered, no
    other is started, (False, None, Stalled) at once; else every retry on a mount stalled for days left one more
    thread behind, stuck in the kernel."""
    if key is not None:
        with _UNANSWERED_LOCK:
            earlier = _UNANSWERED.get(key)
            if earlier is not None and earlier.is_alive():
                return False, None, Stalled("an earlier look has not answered yet (stalled)")
            _UNANSWERED.pop(key, None)
    timeout_s = waited = SHARED_STORAGE_PROBE_S if timeout_s is None else timeout_s
    result: list = []
    failed: list[str] = []

    def probe():
        try:
            result.append(fn(*args))
        except OSError as e:
            failed.append(f"cannot be read ({e})")
        except Exception as e:  # noqa: BLE001 - said as what it is by the caller, not as a thread's traceback
            failed.append(raised(e))

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    if on_slow is not None and timeout_s > SLOW_PROBE_S:
        worker.join(SLOW_PROBE_S)
        if worker.is_alive():
            try:
                on_slow(timeout_s - SLOW_PROBE_S)
            except OSError:  # words about the look (a closed stdout: EPIPE) never fail the look itself
                pass
        timeout_s -= SLOW_PROBE_S
    worker.join(timeout_s)
    if key is not None and worker.is_alive():
        with _UNANSWERED_LOCK:
            _UNANSWERED[key] = worker
    if result:
        return True, result[0], ""
    if failed and isinstance(failed[0], Raised) and not says_why:
        say_raised(fn, failed[0])
    return False, None, failed[0] if failed else Stalled(f"did not answer within {waited:g} s (stalled)")


def say_raised(fn, why: Raised) -> None:
    """One line on stderr (the supervisor's: its window, the journal) naming the look that raised and what it said,
    never a traceback; dropped when stderr cannot take it."""
    name = printable(getattr(fn, "__qualname__", None) or type(fn).__name__)
    try:
        print(f"minilmd: a look at shared storage ({name}) {why}: taken as no answer", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass

