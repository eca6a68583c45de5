"""A check of shared storage (NFS) in a thread, bounded: a mount that fails or stalls is not a config error (staging
and sync retry it and show it in status), so it answers nothing rather than a traceback or a hang. Used by the
config checks (minilmd/probes.py, path_checks.py) and by the launch's looks at the remote (daemon/jobs). Torch-free.
"""
from __future__ import annotations

import threading
from typing import Any

SHARED_STORAGE_PROBE_S = 5.0
"""How long the config check waits for the corpus source, the remote or init.from (NFS) to answer before leaving it
to staging and sync, which retry and show "remote unavailable" (init.from: "init source unreachable", or stalled)
in status."""


def shared_storage_check(check, *args) -> list[str]:
    """Run a path check on shared storage (NFS) in a thread: a mount that fails (EIO) or stalls is not a config
    error (the supervisor retries it and shows it in status), so it yields no problem here rather than a
    traceback or a hang."""
    answered, result, _ = bounded_probe(check, *args)
    return result if answered else []


def bounded_probe(fn, *args, timeout_s: float | None = None) -> tuple[bool, Any, str]:
    """fn(*args) on shared storage, in a thread for `timeout_s` (None: SHARED_STORAGE_PROBE_S) at most: (True, its
    result, "") when it returned; (False, None, why) when it raised an OSError or did not answer (a stalled mount:
    the thread is left behind, a daemon)."""
    timeout_s = SHARED_STORAGE_PROBE_S if timeout_s is None else timeout_s
    result: list = []
    failed: list[str] = []

    def probe():
        try:
            result.append(fn(*args))
        except OSError as e:
            failed.append(f"cannot be read ({e})")

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if result:
        return True, result[0], ""
    return False, None, failed[0] if failed else f"did not answer within {timeout_s:g} s (stalled)"

