"""init.from that does not answer when the launch looks at it (a hung share: the look blocks, no error): said as soon
as the look is slow, and not looked at again by the launch's measure of scratch's room, which would wait the same
bound on the same share in silence.

Before, a run whose init.from stalled spent about 15 s in three bounded looks at it (the config check's, the room
check's, the supervisor's start's, SHARED_STORAGE_PROBE_S each) before its first event, with nothing said anywhere.
Now the config check's look, slow past SLOW_PROBE_S, says on stdout (where the user watches `minilmd run` start:
the terminal, the unit's journal, the tmux window) what it waits on and for how long at most, in status's words
(minilmd/fmt.py `not_answering`); the room check passes it by (staging measures the room again and refuses there
what can never fit); the supervisor's start look says the same in supervisor.log when it is slow
(daemon/phases/initwait.py). A look that answers forgets it. Torch-free.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from minilmd.fmt import not_answering

_stalled: dict[str, float] = {}
"""init.from (as the config names it) -> when this process's look at it began, while that look has not answered."""


def what(init_from: str | os.PathLike) -> str:
    """How init.from is named where its reads stall: "init.from PATH" (staging's reads, daemon/jobs/initstage.py;
    the launch's and the start's slow looks)."""
    return f"init.from {init_from}"


def slow_look(init_from: str | os.PathLike, who: str, say) -> Callable[[float], None]:
    """The `on_slow` of a bounded_probe's look at init.from that begins now: once slow, it notes init.from as
    stalled and says `say(line)`: "init.from P not answering since T (stalled): WHO waits for it N s more at most,
    then the run stages and waits for it there (not a failure)"; T: when the first look of this process that has
    not answered began (the launch's, for the start's)."""
    began = _stalled.get(str(init_from)) or time.time()

    def on_slow(left_s: float) -> None:
        _stalled[str(init_from)] = began
        say(f"{not_answering(what(init_from), began)}: {who} waits for it {left_s:g} s more at most, then the run "
            f"stages and waits for it there (not a failure)")

    return on_slow


def answered(init_from: str | os.PathLike) -> None:
    """A look at init.from answered (with what it holds, or an error): it is not stalled now."""
    _stalled.pop(str(init_from), None)


def stalled(init_from: str | os.PathLike | None) -> bool:
    """Whether this process's last look at init.from did not answer."""
    return bool(init_from) and str(init_from) in _stalled
