"""A long text said once: `status` and `stop` write "said above" where a line would repeat a text shown already.

A sync refused by run.remote's owner record put its refusal, a thousand characters with every way on, in the phase's
reason, the sync's error and the last error alike: `status` showed it three times (why, sync, last error), `stop` as
often (the phase, the outcome, the last error, the last sync's error). Each says it once now, where it is first
shown; `minilmd logs` has every line whole. Torch-free.
"""
from __future__ import annotations

from collections.abc import Iterable

SAID = "said above"
LONG_CHARS = 60
"""A piece shorter than this is said again (a step, an errno): only a long text is worth pointing back to."""


def fold(text: str, shown: str, pieces: Iterable[str | None]) -> str:
    """`text` with each long piece of it (`pieces`: the run's sync error, last error, reason) that `shown` holds
    already written as SAID; SAID when the whole text was shown."""
    if not text or not shown:
        return text
    if text in shown:
        return SAID
    for piece in sorted({p for p in pieces if p and len(p) >= LONG_CHARS}, key=len, reverse=True):
        if piece in text and piece in shown:
            text = text.replace(piece, SAID)
    return text
