"""Reading a safetensors file without torch, numpy only and one sequential read (never mmap: a file on NFS must not
be able to kill its reader with SIGBUS), opened as minilmd/untrusted.py opens a file from elsewhere (no link, no
FIFO): its sha256, the dtype and shape of each tensor, the non-finite values and the one-element tensors, for
minilmd/checkpoint.py's validation. The header is untrusted even when the file's
hash matches a manifest: it is parsed with minilmd/untrusted.py's `loads` (depth bound, an object) and every entry
must have exactly the shape the format defines, the tensors tiling the data in order to the last byte.

A loader asks for the bytes too (`keep`): the file is then read whole, once, and scanned and hashed in memory, so
that what it loads is exactly what was hashed and scanned; reading the path again would load whatever whoever can
write the file put there since. A resume's rank 0 keeps them so, writable (its tensors are views of them:
checkpoint_load.validated_for_loading); its other ranks read them once into a buffer as they hash them
(checkpoint_load.for_loading); both ask in_memory for their layout: the one parser of a header, here.
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from minilmd.untrusted import Unreadable, is_count, kind_of, loads, open_regular, printable, size_text

MAX_HEADER = 64 << 20
"""The longest header a scan reads."""
_READ_CHUNK = 16 << 20
# safetensors dtype name -> (numpy dtype used to read it, is floating point)
_NP_DTYPES = {"F64": ("<f8", True), "F32": ("<f4", True), "F16": ("<f2", True), "BF16": ("<u2", True),
              "I64": ("<i8", False), "I32": ("<i4", False), "I16": ("<i2", False), "I8": ("i1", False),
              "U8": ("u1", False), "BOOL": ("u1", False)}


class InMemory(NamedTuple):
    """A safetensors file held in memory, its header parsed and checked by this module's one parser: what a loader
    makes tensors over (trainer/checkpoint/held_tensors.py) without copying the bytes."""

    data: bytearray
    """The whole file, as its reader hashed it."""
    entries: dict[str, dict]
    """{name: {"dtype", "shape", "data_offsets"}} sorted by offset, the offsets from data_start, tiling the data."""
    data_start: int
    """Where the tensors' data starts: 8 + the header's length."""


def in_memory(data: bytearray, name: str) -> InMemory:
    """The layout of a safetensors file held in memory, checked as a scan checks it (bounded in length and depth,
    every entry of the shape the format defines, the tensors tiling the data to its last byte); the data not copied.
    Raises ValueError naming what is wrong."""
    entries, start, _ = _parse_held(data, name)
    return InMemory(data, entries, start)


def safetensors_metadata(data: bytes, name: str) -> dict[str, str]:
    """The `__metadata__` of a safetensors file held in memory ({} when it has none), its header parsed and checked
    as in_memory checks it. Raises ValueError naming what is wrong."""
    return _parse_held(data, name)[2]


def _parse_held(data: bytes | bytearray, name: str) -> tuple[dict, int, dict[str, str]]:
    """_parse_safetensors_header of a file held in memory: its header's bytes are copied out, the rest not."""
    at = 8

    def read(n: int) -> bytes:
        nonlocal at
        with memoryview(data) as view:
            chunk = bytes(view[at:at + n])
        at += len(chunk)
        return chunk

    with memoryview(data) as view:
        first = bytes(view[:8])
    return _parse_safetensors_header(first, read, len(data), name)


def _parse_safetensors_header(raw8: bytes, read: Callable[[int], bytes | memoryview], size: int,
                              name: str) -> tuple[dict, int, dict[str, str]]:
    """(tensor entries sorted by offset, data start, the metadata). Raises ValueError naming what is wrong: the
    header is read as untrusted JSON (depth bound, an object), and every entry must be {"dtype", "shape",
    "data_offsets"} with the tensors tiling the data exactly, in order, without gaps or overlaps, to the last byte of
    the file; the metadata, when there, an object of strings (the format's)."""
    if len(raw8) < 8:
        raise ValueError(f"{name}: shorter than a safetensors header")
    (n,) = struct.unpack("<Q", raw8)
    if n > MAX_HEADER or 8 + n > size:
        raise ValueError(f"{name}: header length {n} does not fit a {size}-byte file")
    try:
        header = loads(bytes(read(n)), expect=dict)
    except Unreadable as err:
        raise ValueError(f"{name}: header is not a JSON object ({err.why})") from None
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{name}: __metadata__ is not an object of strings")
    for key, e in header.items():
        problem = _entry_problem(e)
        if problem:
            raise ValueError(f"{name}: tensor {printable(key)!r} {problem}")
    entries = dict(sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]))
    expected_start = 0
    for key, e in entries.items():
        begin, end = e["data_offsets"]
        itemsize = np.dtype(_NP_DTYPES[e["dtype"]][0]).itemsize
        if begin != expected_start or end - begin != math.prod(e["shape"]) * itemsize:
            raise ValueError(f"{name}: tensor {printable(key)!r} has inconsistent offsets {e['data_offsets']}")
        expected_start = end
    if 8 + n + expected_start != size:
        raise ValueError(f"{name}: tensors end at byte {8 + n + expected_start}, file has {size}")
    return entries, 8 + n, metadata


def _entry_problem(e: Any) -> str | None:
    """What is wrong with one safetensors header entry (None: its shape is right; the offsets are checked against
    each other and the file by the caller)."""
    if not isinstance(e, dict):
        return f"is {kind_of(e)}, not an object with dtype, shape and data_offsets"
    if not isinstance(e.get("dtype"), str) or e["dtype"] not in _NP_DTYPES:
        return f"has unsupported dtype {printable(repr(e.get('dtype')))[:40]}"
    shape, offsets = e.get("shape"), e.get("data_offsets")
    if not isinstance(shape, list) or len(shape) > 8 or not all(is_count(d) for d in shape):
        return "has no valid shape (a list of non-negative integers)"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_count(o) for o in offsets) \
            or offsets[0] > offsets[1]:
        return "has no valid data_offsets (two non-negative integers, begin <= end)"
    return None


def _nonfinite_count(buf: bytes | memoryview, dtype: str) -> int:
    np_dtype, is_float = _NP_DTYPES[dtype]
    if not is_float:
        return 0
    a = np.frombuffer(buf, dtype=np_dtype)
    if dtype == "BF16":  # numpy has no bfloat16: an all-ones exponent is inf or NaN
        return int(np.count_nonzero((a & 0x7F80) == 0x7F80))
    return int(a.size - np.count_nonzero(np.isfinite(a)))


class Scan(NamedTuple):
    """What one read of a safetensors file found."""

    sha256: str
    tensors: dict[str, dict]
    """{name: {"dtype", "shape"}} of every tensor."""
    nonfinite: dict[str, int]
    """{name: count of NaN and inf values}, for the tensors that have any."""
    scalars: dict[str, float]
    """{name: value} of the one-element tensors (an optimizer's step)."""
    data: bytes | bytearray | None = None
    """The whole file exactly as hashed and scanned, when asked for (`keep`; a bytearray when `writable`); else
    None."""


def scan_safetensors(path: str | os.PathLike, *, size: int | None = None, keep: bool = False,
                     writable: bool = False, check_header: Callable[[dict[str, dict]], None] | None = None) -> Scan:
    """One sequential read of a safetensors file (see Scan). `size`: the size its manifest lists, the only size
    read (a file of another size when opened is refused before a byte is read: it was replaced since its size was
    looked at). `keep`: the file's bytes are kept in Scan.data (read whole once, then scanned in memory: no more
    than `size` when given, the file's own size else); `writable`: kept in a bytearray, which a loader makes its
    tensors over (held_tensors: an optimizer updates its state in place), where bytes is what safetensors' own load
    takes. `check_header`: given the tensors' {name: {"dtype", "shape"}} once the header alone is read (no more than
    MAX_HEADER), before a `keep` reads the file whole; what it raises is raised, nothing more read (a file of the
    listed size with a header of other shapes, a huge sparse one: refused before its size is in memory).
    Raises ValueError for a malformed file, its subclass Unreadable for one that is not a regular file,
    cannot be opened or has not the size listed."""
    path = Path(path)
    fd = open_regular(path)  # a checkpoint from elsewhere: no link followed, no FIFO blocked on (Unreadable)
    h = hashlib.sha256()
    nonfinite: dict[str, int] = {}
    scalars: dict[str, float] = {}
    kept = None
    with os.fdopen(fd, "rb") as f:
        have = os.fstat(fd).st_size
        if size is not None and have != size:
            raise Unreadable(f"{have} bytes, listed as {size}", path, kind="wrong_size")
        if keep:
            if check_header is not None:
                entries, _, _ = _parse_safetensors_header(f.read(8), f.read, have, path.name)
                check_header(_shapes(entries))
                f.seek(0)
            kept = _read_whole(f, have, path, writable)
        source: BinaryIO | _Held = _Held(kept) if kept is not None else f  # kept: the file is not read again

        def read(n: int) -> bytes | memoryview:
            b = source.read(n)
            h.update(b)
            return b

        entries, _, _ = _parse_safetensors_header(bytes(read(8)), read, have, path.name)
        shapes = _shapes(entries)
        for key, e in entries.items():
            begin, end = e["data_offsets"]
            itemsize = np.dtype(_NP_DTYPES[e["dtype"]][0]).itemsize
            remaining, bad = end - begin, 0
            chunk = max(itemsize, _READ_CHUNK // itemsize * itemsize)
            while remaining:
                buf = read(min(chunk, remaining))
                if not buf:
                    raise ValueError(f"{path.name}: ends inside tensor {key}")
                remaining -= len(buf)
                bad += _nonfinite_count(buf, e["dtype"])
                if end - begin == itemsize and e["dtype"] != "BF16":
                    scalars[key] = float(np.frombuffer(buf, dtype=_NP_DTYPES[e["dtype"]][0])[0])
            if bad:
                nonfinite[key] = bad
    return Scan(h.hexdigest(), shapes, nonfinite, scalars, kept)


def read_whole(path: Path, size: int) -> bytearray:
    """A file from elsewhere (opened as open_regular opens one) read whole into one bytearray of `size`, the size its
    manifest lists: one of another size when opened is refused before a byte is read (a manifest's word alone never
    allocates), one that grew while read refused (_read_whole, which scan_safetensors's `keep` reads with too).
    Raises Unreadable."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        have = os.fstat(fd).st_size
        if have != size:
            raise Unreadable(f"{have} bytes, listed as {size}", path, kind="wrong_size")
        data = _read_whole(f, size, path, writable=True)
    assert isinstance(data, bytearray)  # writable
    return data


def _shapes(entries: dict[str, dict]) -> dict[str, dict]:
    return {k: {"dtype": e["dtype"], "shape": tuple(e["shape"])} for k, e in entries.items()}


def _read_whole(f: io.BufferedIOBase, size: int, path: Path, writable: bool = False) -> bytes | bytearray:
    """The file's `size` bytes (its size when opened) in one bytes object (a bytearray when `writable`), held once
    in memory (the loader uses them as they are); one more byte is asked for, so that a file that grew since is
    refused."""
    try:
        if writable:
            data: bytes | bytearray = bytearray(size)
            with memoryview(data) as view:
                at = 0
                while at < size and (n := f.readinto(view[at:])):
                    at += n
            grown = at == size and f.read(1)
            got = size + 1 if grown else at
        else:
            data = f.read(size + 1)
            got = len(data)
    except OSError as e:
        raise Unreadable(f"cannot be read: {e.strerror or e}", path, os_error=e) from None
    if got != size:
        raise Unreadable(f"changed while being read ({size_text(size)} when opened)", path, kind="changed")
    return data


class _Held:
    """A file held in memory read in order as a scan reads one, each read a view of it, not a copy (io.BytesIO
    copies every read, and the whole of a bytearray it is given)."""

    def __init__(self, data: bytes | bytearray):
        self.view, self.at = memoryview(data), 0

    def read(self, n: int) -> memoryview:
        chunk = self.view[self.at:self.at + n]
        self.at += len(chunk)
        return chunk
