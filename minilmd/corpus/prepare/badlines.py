"""Every bad line of a prepare (or `prepare --append`), named at once (issue 24: a 13 GB corpus cannot be fixed one
line per run).

The whole input is read whatever `--on-bad-line`; each bad line is counted by reason, the first SHOWN are kept in
memory (the screen, and meta.json's `bad_lines.examples`), and every one is streamed as `file:line: reason
(detail)` to a file in the prepare's own temporary directory, so memory stays bounded whatever their number. With
more than SHOWN, that file is moved beside --out as `<out>.bad-lines.txt` (a rename between the two directories'
descriptors, minilmd/dirfd.py: no name is followed, and a name this user may not replace there gets a fresh unique
one, printed) before anything is published; otherwise it is
removed. `--on-bad-line error` then exits 65 listing them, publishing nothing; `skip` lists them and goes on.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TextIO

from minilmd.corpus.sources.bad_tally import SHOWN, BadLineTally
from minilmd.dirfd import Dir
from minilmd.fsio import others_entry

LIST_SUFFIX = ".bad-lines.txt"
SPOOL = "bad-lines.txt"  # in the temporary directory, never published inside the corpus


def list_name(out_name: str) -> str:
    return out_name + LIST_SUFFIX


def _fresh_prefix(out_name: str) -> str:
    return list_name(out_name)[:-4] + "-"


def longest_list_name(out_name: str) -> str:
    """The longest name the list file may get beside --out: the fresh one, mkstemp's 8 random characters in it."""
    return _fresh_prefix(out_name) + "X" * 8 + ".txt"


class BadLines(BadLineTally):
    """The bad lines seen so far: counts by reason, the first SHOWN as text (BadLineTally, the rule tokenizer train
    shares), all of them in the spool file."""

    def __init__(self, spool: Path, shown: int = SHOWN):
        super().__init__(shown)
        self.spool = spool
        self.file: TextIO | None = None
        self.listing: Path | None = None  # where the list went, once published
        self.earlier_list: Path | None = None  # a list an earlier prepare left beside --out, when this one made none

    def add(self, source: str, line: int, reason: str, detail: str) -> str:
        text = super().add(source, line, reason, detail)
        if self.file is None:
            self.file = open(self.spool, "x", encoding="utf-8")
        self.file.write(text + "\n")
        return text

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def publish(self, tmp: Dir, parent: Dir, out_name: str) -> Path | None:
        """The list file beside the corpus `out_name` in `parent` when there are more bad lines than are shown (its
        path); the spool (SPOOL in the temporary directory `tmp`) removed either way (it must not be published inside
        the corpus). Through the two directories' descriptors (minilmd/dirfd.py): no name is followed."""
        self.close()
        if tmp.lstat(SPOOL) is None or self.total <= self.shown:
            if tmp.lstat(SPOOL) is not None:
                tmp.remove_file(SPOOL)
            self.earlier_list = _earlier_list(parent, out_name)
            return None
        tmp.mode_file(SPOOL, 0o644)  # beside the corpus, readable as the corpus is
        target = list_name(out_name)
        try:
            if others_entry(parent, parent.path / target):  # a teammate's file in a team directory: kept (audit 8)
                raise FileExistsError(target)
            tmp.rename(SPOOL, parent, target)  # replaces a list of an earlier run of ours; never follows a link
        except OSError:  # a directory there, or another user's entry: a fresh name
            fd, target = parent.create_new(_fresh_prefix(out_name), ".txt")
            os.close(fd)
            tmp.rename(SPOOL, parent, target)
        self.listing = parent.path / target
        return self.listing

    def earlier_list_note(self) -> str:
        """What to say of the list an earlier prepare left beside --out, when this one wrote none ("" if none is
        there): read beside the new corpus, it would be taken for this one's (a new user's first prepare, without
        --format chat, left chat.bad-lines.txt; the next one, with it, published prep/chat beside it, unsaid)."""
        if self.earlier_list is None:
            return ""
        this = f"this one had {self.total:,}, all shown above" if self.total else "this one had none"
        return (f"note: {self.earlier_list} is an earlier prepare's list of bad lines, not this one's ({this}): "
                f"remove it")

    def where_all(self) -> str:
        return f"all {self.total:,} in {self.listing}" if self.listing else super().where_all()


def _earlier_list(parent: Dir, out_name: str) -> Path | None:
    """The list file of an earlier prepare beside --out: a regular file at its name (looked at, never followed)."""
    st = parent.lstat(list_name(out_name))
    return parent.path / list_name(out_name) if st is not None and stat.S_ISREG(st.st_mode) else None
