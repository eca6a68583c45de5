"""`minilmd` that holds a corpus command (`prepare`, `corpus report`, `corpus count`) at one moment, for tests of a
Ctrl-C that lands there:

    HELD_PHASE=PHASE HELD_DIR=DIR python tests/held_corpus_cli.py prepare ...   (in place of `minilmd prepare`)

At PHASE the process creates DIR/PHASE and waits until DIR/go exists: the test signals the command there, then lets
it go on, whatever the machine's speed. PHASE is one of
- worker-start: a worker starting (spawn imports this file as its __mp_main__ first), before its initializer has
  run: where a Ctrl-C at about 4 s landed;
- encode: a prepare worker encoding its first block;
- write: prepare writing the splits, the encoding done;
- scan: a `corpus report` or `corpus count` worker reading its first shard.
Patched when this file is imported: in this process, and in every process spawn starts from it.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from minilmd.corpus.analysis import scan
from minilmd.corpus.prepare import encode, pipeline

PHASE, HELD_DIR = os.environ.get("HELD_PHASE", ""), Path(os.environ.get("HELD_DIR", "."))


def hold(phase: str) -> None:
    if PHASE != phase:
        return
    (HELD_DIR / phase).touch()
    while not (HELD_DIR / "go").exists():
        time.sleep(0.05)


if __name__ == "__mp_main__":  # a spawned worker, importing its parent's main script before anything else
    hold("worker-start")

_real_call = encode.BlockEncoder.__call__
_real_write_splits = pipeline.write_splits
_real_run_shard = scan.run_shard


def _held_call(self, blob, first_line):
    hold("encode")
    return _real_call(self, blob, first_line)


def _held_write_splits(*args, **kwargs):
    hold("write")
    return _real_write_splits(*args, **kwargs)


def _held_run_shard(corpus, shard, task):
    hold("scan")
    return _real_run_shard(corpus, shard, task)


encode.BlockEncoder.__call__ = _held_call
pipeline.write_splits = _held_write_splits
scan.run_shard = _held_run_shard

if __name__ == "__main__":
    from minilmd.cli import main

    main()
