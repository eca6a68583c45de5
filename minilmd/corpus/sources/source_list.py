"""The sources a command names (`prepare`, `prepare --append`, `tokenizer train`): every one checked and measured up
front, then read one at a time.

Each is opened as jsonl.Source opens it (its checks: a missing file, a directory, a FIFO, a file this user may not
read, another user's link fail there), measured and closed at once, before any is read: a mistyped shard at the end
of thousands fails in a second with its own words and nothing written, not after an hour of reading, and the bytes
to read are known for the progress. None is held open after: the reader opens each in turn as it reads it
(minilmd/corpus/prepare/stream.py, train_texts.py), the same checks again on that open, so that one source is open at
a time whatever their number. Before, prepare held every source open for the whole read (and tokenizer train for a
while): a corpus in more shards than the soft limit of open files (1,024 by default; a sharded dataset has
thousands) failed with EMFILE, "cannot open ([Errno 24] Too many open files)", exit 74.
"""
from __future__ import annotations

from minilmd.corpus.sources.jsonl import Source


def source_sizes(sources: list[str]) -> list[int]:
    """The bytes of each source (of the file: compressed ones too, as the progress counts them), in order, each
    opened with Source's checks (InputError or LinkRefused for the first that fails them) and closed before the
    next is opened."""
    sizes = []
    for path in sources:
        src = Source(path)
        try:
            sizes.append(src.size)
        finally:
            src.close()
    return sizes
