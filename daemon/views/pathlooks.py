"""A view's look at a path a run's own files name (state.json's checkpoint paths and run directory claim, run.toml's
scratch): the one way `status`, `status --all` and `stop` touch such a path.

Those files are their user's to write: he may name an autofs or FUSE path that never answers, so that root's
`status --all`, or `status RUN` and `stop` of his run, blocked in a stat for as long as it stalls (before: every
look below was a plain stat, listing or open; the overview showed his whole row as "unreadable", saying nothing of
the path). Each look runs in a thread (minilmd/bounded.py bounded_probe) for LOOK_S at most, keyed by its path, so
that a second look at a path that has not answered yet returns at once instead of waiting again; what did not answer
is kept (`Looks.unanswered`, its user's words: escaped where printed) for the view to say, and the look's default
(nothing known) is taken. The looks themselves follow no link where they open or list (newest.py, savedpass.py).
Torch-free, light imports.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from minilmd.bounded import Stalled, bounded_probe

Found = TypeVar("Found")
Default = TypeVar("Default")

LOOK_S = 2.0
"""How long a view waits on one path a run's files name. Less than the overview's ROW_WAIT_S, so that a row whose
scratch stalls is shown with the stall said, not as a row that did not answer."""


class Looks:
    """The looks of one view of one run (a status, a row of the overview, a stop), and what did not answer."""

    def __init__(self) -> None:
        self.unanswered: list[str] = []

    def look(self, what: str, path: object, fn: Callable[..., Found], *args: Any, default: Default,
             timeout_s: float = LOOK_S) -> Found | Default:
        """fn(*args), a look at `path` (`what` it is: "scratch", "the run directory state.json names"), bounded;
        `default` when it did not answer in `timeout_s` (said once per path) or failed (an OSError, taken as nothing
        known: what each caller already did with one). A look at shared storage the run reads too (run.remote, the
        corpus: a share that may be slow, not only stalled) is given SHARED_STORAGE_PROBE_S, as before."""
        answered, result, why = bounded_probe(fn, *args, timeout_s=timeout_s, key=("view look", str(path)))
        if answered:
            return result
        if isinstance(why, Stalled):
            said = f"{what} {path} did not answer within {timeout_s:g} s (stalled): not looked at"
            if said not in self.unanswered:
                self.unanswered.append(said)
        return default
