"""A prepared corpus's doc_lengths.npy (its index: one length a document, BOS and EOS counted), read as untrusted and
in bounded memory.

The index is int32 little-endian, as `prepare` writes it (corpus/prepare/collect.py write_splits and append.py
_publish save int32 arrays; meta.json's doc_lengths_dtype says "int32"): any other dtype is refused, so that no
narrow one (a byte a document) is widened many times over. Its header must list at least the documents meta.json
counts (an append being published renames a longer one in before meta.json: its prefix is the corpus meta.json
describes), and the file's size must be exactly what its header says. Nothing but the header is read before those
checks; then only those documents' lengths, whole (`read_prefix`: 4 bytes a document) or CHUNK_DOCS at a time
(`chunks`), never more of the file than meta.json describes.
"""
from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

INDEX_DTYPE = "<i4"
"""The dtype `prepare` writes doc_lengths.npy in (docs/formats.md)."""
NPY_HEADER_MAX = 64 << 10
"""The most bytes read for a .npy file's header (numpy writes 128)."""
CHUNK_DOCS = 1 << 16
"""Lengths read at a time by `chunks`: 256 KiB of the file, about 2 MiB with a caller's temporaries (its sums in
int64), whatever the index's size."""


class IndexLies(ValueError):
    """An index that is not one `prepare` wrote for this corpus (not a .npy, another dtype, fewer documents than
    meta.json counts, a size its header does not give); `truncated` when it is only shorter than its header says (a
    copy not finished): its words name the file and what disagrees."""

    def __init__(self, message: str, truncated: bool = False):
        super().__init__(message)
        self.truncated = truncated


def index_header(fd: int, path: Path, documents: int | None) -> tuple[int, int]:
    """(offset of the first length, lengths the file holds) of the index open at `fd` (`path` names it in words), or
    IndexLies; `documents`: meta.json's count of the split, which it must hold at least (None: no meta.json to
    compare with). Reads the header only."""
    import numpy as np  # here: the supervisor checks a text corpus without numpy
    from numpy.lib import format as npy_format

    f = io.BytesIO(os.pread(fd, NPY_HEADER_MAX, 0))
    try:
        version = npy_format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"a .npy version {version} this reader does not take")
        read = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
        shape, fortran_order, dtype = read(f)
    except (ValueError, EOFError, SyntaxError, TypeError) as e:
        raise IndexLies(f"{path}: not a readable .npy file ({e})") from None
    if len(shape) != 1 or dtype != np.dtype(INDEX_DTYPE):
        raise IndexLies(f"{path}: holds {dtype} of shape {shape}, not the 1-D int32 (little-endian) lengths "
                        f"`minilmd prepare` writes")
    held, offset = int(shape[0]), f.tell()
    if documents is not None and held < documents:
        raise IndexLies(f"{path}: {held:,} document lengths, fewer than the {documents:,} documents its meta.json "
                        f"counts")
    size, want = os.fstat(fd).st_size, offset + 4 * held
    if size != want:
        raise IndexLies(f"{path}: {size:,} bytes, but its header gives {held:,} lengths ({want:,} bytes)"
                        + (" (truncated, or a copy not finished)" if size < want else ""), truncated=size < want)
    return offset, held


def chunks(fd: int, path: Path, offset: int, documents: int) -> Iterator[np.ndarray]:
    """The first `documents` lengths of the index open at `fd` (index_header's offset), CHUNK_DOCS at a time (int32
    arrays, read by position: the descriptor's offset is left alone)."""
    chunk = CHUNK_DOCS
    for first in range(0, documents, chunk):
        yield _read(fd, path, offset + 4 * first, min(chunk, documents - first))


def read_prefix(fd: int, path: Path, offset: int, documents: int) -> np.ndarray:
    """The first `documents` lengths of the index open at `fd`, in one int32 array (4 bytes a document)."""
    return _read(fd, path, offset, documents)


def _read(fd: int, path: Path, at: int, count: int) -> np.ndarray:
    import numpy as np  # here: the supervisor checks a text corpus without numpy

    buf, got = bytearray(4 * count), 0
    with memoryview(buf) as view:
        while got < len(buf) and (n := os.preadv(fd, [view[got:]], at + got)):
            got += n
    if got < len(buf):  # the file shrank since index_header measured it
        raise IndexLies(f"{path}: shorter than its header says (truncated, or being rewritten)", truncated=True)
    return np.frombuffer(buf, dtype=INDEX_DTYPE)
