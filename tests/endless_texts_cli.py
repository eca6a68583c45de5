"""`minilmd` whose corpus reader never ends, for tests of a command interrupted while it reads and trains:

    python tests/endless_texts_cli.py tokenizer train CORPUS ...    (in place of `minilmd tokenizer train ...`)

minilmd.corpus.sources.train_texts.iter_texts yields the real texts of CORPUS, then creates the file named by
ENDLESS_TEXTS_STARTED and goes on yielding a text every 0.2 s for ever: as a corpus too big to finish before the
user's Ctrl-C, however fast the machine. Patched when this file is imported: in this process, and in every process
multiprocessing's spawn starts from it (spawn imports the parent's main script first). Otherwise the real command.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from minilmd.corpus.sources import train_texts

STARTED_ENV = "ENDLESS_TEXTS_STARTED"
_real_iter_texts = train_texts.iter_texts


def _endless(sources, on_bad_line="error", bad_counts=None, progress=None):
    yield from _real_iter_texts(sources, on_bad_line, bad_counts, progress)
    Path(os.environ[STARTED_ENV]).touch()
    while True:
        time.sleep(0.2)
        yield "more text, and never the end of it"


train_texts.iter_texts = _endless

if __name__ == "__main__":
    from minilmd.cli import main

    main()
