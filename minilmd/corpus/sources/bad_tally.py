"""The bad lines of a corpus read, said one way by every reader: `prepare` (and `--append`) and `tokenizer train`
(iter_texts); `corpus report` and `count` name their lines too long to hold with it, `bench prepare` what its floors
skipped. Counted by reason, the first SHOWN kept as text, the rest counted; `error` is the exit-65 message of
`--on-bad-line error` (every bad line named in one run: a 13 GB corpus cannot be fixed one line per run, issue 24),
`log_skipped` what `skip` says. prepare's BadLines (minilmd/corpus/prepare/badlines.py) adds the list of all of
them, written beside --out.
"""
from __future__ import annotations

from dataclasses import dataclass

from minilmd.untrusted import printable

SHOWN = 20  # bad lines named on the screen (and in a corpus's meta.json)


class InputError(ValueError):
    """Bad corpus input (unreadable source, bad line under --on-bad-line error): the message says file and line."""


@dataclass
class BadLine:
    source: str
    line: int
    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.reason.replace('_', ' ')} ({self.detail})"


class BadLineTally:
    """The bad lines seen so far: counts by reason, the first `shown` as text. Picklable (tokenizer train's
    training process sends it back)."""

    def __init__(self, shown: int = SHOWN):
        self.shown = shown
        self.counts: dict[str, int] = {}
        self.first: list[str] = []
        self.total = 0
        self.json_documents: list[str] = []  # sources that are one JSON array, not JSON lines (line_shape.py)

    def add(self, source: str, line: int, reason: str, detail: str) -> str:
        """Count one bad line; its text (`file:line: reason (detail)`, made printable)."""
        text = printable(str(BadLine(source, line, reason, detail)))
        self.total += 1
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.first) < self.shown:
            self.first.append(text)
        return text

    def by_reason(self) -> str:
        """The count of each reason, `chat line: 467` (a new user read `(chat line 467)` as the line number)."""
        return ", ".join(f"{reason.replace('_', ' ')}: {n:,}" for reason, n in sorted(self.counts.items()))

    def where_all(self) -> str:
        """Where every bad line is named, for the line after the first `shown`: here, only their number."""
        return f"{self.total:,} in all"

    def named(self) -> list[str]:
        """The lines that name them: the first `shown`, then where all of them are."""
        lines = list(self.first)
        if self.total > len(self.first):
            lines.append(f"... and {self.total - len(self.first):,} more: {self.where_all()}")
        return lines

    def error(self, hint: str = "") -> InputError:
        """The exit-65 error of --on-bad-line error: every bad line named (the first `shown`, then where all are);
        `hint`, advice on the whole input, said once after them."""
        advice = "pass --on-bad-line skip to skip bad lines and count them"
        if self.total == 1:
            return InputError(f"{self.first[0]}; nothing was written. Fix the line or {advice}"
                              + f"\n{hint}" * bool(hint))
        return InputError(f"{self.total:,} bad lines ({self.by_reason()}); nothing was written. Fix them or "
                          f"{advice}:\n" + "\n".join(self.named() + [hint] * bool(hint)))

    def log_skipped(self, log, hint: str = "") -> None:
        """--on-bad-line skip: the bad lines this run skipped, by name, and `hint` (error's) once."""
        if self.total:
            log(f"bad lines skipped by this run ({self.by_reason()}):")
            for line in self.named():
                log(f"  {line}")
        if hint:
            log(hint)
