"""Reading `{"text": ...}` JSONL corpora: local paths or fsspec URLs, .gz/.zst inferred, in blocks of whole lines.

Shared by `minilmd prepare` and `minilmd tokenizer train`, so that both accept and refuse exactly the same lines.
A line is bad when it is not valid UTF-8, not valid JSON, not an object with a "text" key, or its text is not a
string or is empty (whitespace only counts as empty). JSON nested deeper than MAX_JSON_DEPTH arrays and objects is
not valid JSON here (`invalid_json`): json.loads would recurse once per level and raise RecursionError, so every
reader parses with `loads_bounded`, which counts the depth first. Blank lines are not documents; they are counted,
not bad.
A line longer than a block is not held whole: `Source.items` hands it out as a `LongLine` read in chunks, which
minilmd/corpus/sources/longdoc.py parses as it streams (the same verdicts as parse_block). `Source.items` is the one
way a corpus's lines are read (prepare, tokenizer train, corpus report and count, bench prepare): a reader that
needs each line whole takes `Source.blocks`, which joins a long line of at most MAX_LINE_BYTES (or its own bound)
and reads a longer one through in chunks, an `OverLong`: a bad line, `line_too_long`, never held.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from minilmd.corpus.sources.bad_tally import BadLine, BadLineTally, InputError  # noqa: F401 - BadLine, InputError: here too
from minilmd.corpus.sources.line_shape import ADVICE, LINE_OF, other_format
from minilmd.place_rule import PlaceRefused
from minilmd.untrusted import MAX_LINE_DEPTH, Unreadable, loads_any

BAD_LINE_POLICIES = ("error", "skip")
MAX_JSON_DEPTH = MAX_LINE_DEPTH


def loads_bounded(s: str | bytes, max_depth: int = MAX_JSON_DEPTH):
    """A corpus line's (or a small file's) JSON value, of any type, by untrusted.loads_any at a corpus's depth bound:
    a ValueError in json's own words for a line that is not JSON (a bad line's detail says where it stops), "nested
    deeper than {max_depth}" before json.loads could recurse into a RecursionError, "not UTF-8" for bytes that are
    not (what prepare's readers call invalid_utf8 first)."""
    return loads_any(s, max_depth=max_depth)


BOM = b"\xef\xbb\xbf"
"""UTF-8's byte order mark: taken at the very start of a source (Source.items), a bad line anywhere else."""


class SourceReadError(InputError):
    """A source that failed while read (EIO, a share gone): not bad data, a run later may read it (exit 74)."""


class SourceNotOpened(InputError):
    """A source named on the command line that is not a file this user can read: not there, a directory or another
    thing that is not a regular file (a FIFO), or not readable by this user. A bad argument, as a config file or a
    --tokenizer that is not there is (exit 2: minilmd/corpus/exits.py data_error_exit), never bad data (65)."""


def not_opened(path: str, e: Exception) -> InputError:
    """What a source that could not be opened is said as (Source, and `corpus report` and `count` of a local
    file): the one home of those words and, by its class, of the exit status. Before, all of them were bad data
    (exit 65, "cannot open ([Errno 2] ...)"), a path mistyped told like a corpus with a bad line."""
    if isinstance(e, Unreadable):  # sources/local.py open_source: what it is instead of a regular file
        return SourceNotOpened(f"{path}: cannot open ({e.why})")
    if isinstance(e, (FileNotFoundError, NotADirectoryError)):
        return SourceNotOpened(f"{path}: no such file")
    if isinstance(e, IsADirectoryError):  # an fsspec store's words for it
        from minilmd.corpus.sources.local import NOT_REGULAR

        return SourceNotOpened(f"{path}: cannot open (a directory{NOT_REGULAR})")
    if isinstance(e, PermissionError):
        return SourceNotOpened(f"{path}: cannot open: permission denied (you may not read it, or may not enter a "
                               "directory on its way)")
    if isinstance(e, OSError):  # EIO, ESTALE: a disk or share that failed, not the path given (exit 74)
        return SourceReadError(f"{path}: cannot open ({e})")
    return SourceNotOpened(f"{path}: cannot open ({e})")  # a URL fsspec cannot open, a chain over a local path


@dataclass
class ParsedBlock:
    texts: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # 1-based line number of each text
    bad: list[tuple[int, str, str]] = field(default_factory=list)  # (line, reason, detail)
    blank: int = 0
    n_lines: int = 0


class LongLine:
    """One line longer than a block, read from its source in chunks as `chunks()` is iterated (never held whole).
    It must be read to its end (`drain()`) before the source goes on; `rest` is then what followed its newline,
    `size` its bytes without the newline (so far, while it is read)."""

    def __init__(self, line: int, head: bytes, stream, chunk_bytes: int):
        self.line = line
        self.rest = b""
        self.size = 0
        self._chunks = self._read(head, stream, chunk_bytes)

    def chunks(self) -> Iterator[bytes]:
        """The line's bytes, without its newline, in chunks of at most about chunk_bytes."""
        return self._chunks

    def drain(self) -> None:
        for _ in self._chunks:
            pass

    def _read(self, data: bytes, stream, chunk_bytes: int) -> Iterator[bytes]:
        while True:
            cut = data.find(b"\n")
            if cut >= 0:
                self.rest = data[cut + 1:]
                self.size += cut
                if cut:
                    yield data[:cut]
                return
            if data:
                self.size += len(data)
                yield data
            data = stream.read(chunk_bytes)
            if not data:
                return


MAX_LINE_BYTES = 1 << 24
"""The longest line a reader holds whole (Source.blocks: corpus report and count, bench prepare's floors): 16 MiB,
a long book. prepare reads a longer text line in pieces (longdoc.py); chat prepare's bound is its own (16 x the
text a conversation may hold at --seq-len, chat_encode.py)."""
LINE_TOO_LONG = "line_too_long"


@dataclass(frozen=True)
class OverLong:
    """A line longer than the bound of the reader that wanted it whole (Source.blocks): read through, never held."""
    line: int
    size: int  # its bytes, without the newline
    limit: int

    @property
    def bad(self) -> tuple[int, str, str]:
        """(line, reason, detail) as parse_block gives a bad line."""
        return self.line, LINE_TOO_LONG, (f"a line of {self.size:,} bytes, more than the {self.limit:,} read whole "
                                          "here; prepare reads a longer text in pieces")


def json_lines(blob: bytes, first_line: int, counts) -> Iterator[tuple[int, object, tuple[str, str] | None]]:
    """(line number, JSON value, None) for each line of whole lines of JSONL that decodes, (line number, None,
    (reason, detail)) for one that is not UTF-8 or not JSON; blank lines are only counted (counts.blank, and
    counts.n_lines for all). Shared by text (parse_block), chat and DPO (chat.checked_lines) corpora."""
    lines = blob.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    counts.n_lines = len(lines)
    for i, raw in enumerate(lines):
        lineno = first_line + i
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip():
            counts.blank += 1
            continue
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield lineno, None, ("invalid_utf8", f"byte {e.start}: {raw[e.start:e.start + 4]!r}")
            continue
        try:
            obj = loads_bounded(s)
        except ValueError as e:
            yield lineno, None, ("invalid_json", str(e))
            continue
        yield lineno, obj, None


CHAT_LINE, TEXT_LINE, DPO_LINE = LINE_OF["chat"], LINE_OF["text"], LINE_OF["dpo"]
"""Lines of another format than the reader's (line_shape.py): chat data or preference pairs given as text, text
given to `prepare --format chat`, ..."""
CHAT_ADVICE, TEXT_ADVICE, DPO_ADVICE = ADVICE[CHAT_LINE], ADVICE[TEXT_LINE], ADVICE[DPO_LINE]


def _without_text(obj: object) -> tuple[str, str]:
    """The reason and detail of a line that is not an object with "text": the key expected and what the line
    holds instead (its first keys), a line of another format told as one (line_shape.other_format)."""
    if not isinstance(obj, dict):
        return "missing_text", f"line is a JSON {type(obj).__name__}"
    other = other_format(obj, "text")
    if other:
        return other
    keys = ", ".join(json.dumps(key, ensure_ascii=False)[:40] for key in list(obj)[:5]) + (", ..." * (len(obj) > 5))
    return "missing_text", f'line is an object without "text" ({f"its keys: {keys}" if obj else "no key at all"})'


def parse_block(blob: bytes, first_line: int) -> ParsedBlock:
    """Parse whole lines of JSONL; bad lines are collected with their reason, never used."""
    out = ParsedBlock()
    for lineno, obj, bad in json_lines(blob, first_line, out):
        if bad is not None:
            out.bad.append((lineno, *bad))
            continue
        if not isinstance(obj, dict) or "text" not in obj:
            out.bad.append((lineno, *_without_text(obj)))
            continue
        text = obj["text"]
        if not isinstance(text, str):
            out.bad.append((lineno, "text_not_string", f"\"text\" is a JSON {type(text).__name__}"))
            continue
        if not text.strip():
            out.bad.append((lineno, "empty_text", "\"text\" is empty or whitespace"))
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate from a \udXXX escape: not encodable text
            out.bad.append((lineno, "invalid_utf8", f"lone surrogate {text[e.start]!r} at character {e.start}"))
            continue
        out.texts.append(text)
        out.lines.append(lineno)
    return out


class Source:
    """One input file opened for reading in blocks of whole lines; `.position` is raw (compressed) bytes read."""

    def __init__(self, path: str):
        from fsspec.compression import compr
        from fsspec.utils import infer_compression

        from minilmd.urls import open_fs

        self.path = path
        self.linked_to: str | None = None  # where a local path's links lead (followed by the one link rule)
        self._head: list[tuple[bytes, bool]] = []  # the first two non-blank lines (or beginnings): json_array's
        try:
            self.fs, self.fs_path, local = open_fs(path)
            if local:
                self.raw, real = open_real(self.fs_path)
                if real != Path(os.path.abspath(self.fs_path)):
                    self.linked_to = str(real)
                self.size = os.fstat(self.raw.fileno()).st_size
            else:
                self.size = self.fs.size(self.fs_path)
                self.raw = self.fs.open(self.fs_path, "rb")
        except PlaceRefused:  # another user's link among the sources: refused, not a bad source (exit 2)
            raise
        except (OSError, ValueError) as e:
            raise not_opened(path, e) from None
        codec = infer_compression(path)
        if codec is None:
            self.stream = self.raw
        elif codec in compr:
            self.stream = compr[codec](self.raw, mode="rb")
        else:
            self.raw.close()
            hint = " (pip install zstandard)" if codec == "zstd" else ""
            raise InputError(f"{path}: {codec} compression is not available{hint}")

    @property
    def json_array(self) -> bool:
        """One JSON document of records, not JSON lines (json_document: line_shape.py's advice), by the first two
        non-blank lines read."""
        if not self._head:
            return False
        (first, whole), second = self._head[0], self._head[1] if len(self._head) > 1 else None
        return json_document(first, whole, second)

    @property
    def position(self) -> int:
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return 0

    def items(self, block_bytes: int = 1 << 20, start: int = 0, end: int | None = None
              ) -> Iterator[tuple[int, bytes] | LongLine]:
        """(first line number, bytes of whole lines), or a LongLine for a line that outgrows a block (its first
        block_bytes or more bytes were read without a newline). Each LongLine must be drained before the next
        item is asked for. Memory: at most about two blocks, whatever the line lengths. The last block may lack a
        final newline. `start`, `end`: a byte range of an uncompressed file (a shard of corpus report): only the
        lines that start in it, the last one read to its end, numbered from 1 at the first of them."""
        line = 1
        carry = b""
        at_start = not start
        pos = start  # the offset in the file of carry's first byte
        try:
            if start:
                after = self._after_line_at(start - 1, block_bytes, end)
                if after is None:
                    return
                self.raw.seek(after)
                pos = after
            while end is None or pos < end:
                data = self.stream.read(block_bytes)
                if not data:
                    break
                if at_start:
                    (data, dropped), at_start = self._first_bytes(data, block_bytes), False
                    pos += dropped
                data = carry + data
                cut = data.rfind(b"\n")
                blob, carry = (data[:cut + 1], data[cut + 1:]) if cut >= 0 else (b"", data)
                if end is not None and pos + len(blob) > end:  # a line starting at `end` or after: not this range's
                    blob = blob[:blob.find(b"\n", end - 1 - pos) + 1]
                    self._keep_head(blob, whole=True)
                    yield line, blob
                    return
                if blob:
                    self._keep_head(blob, whole=True)
                    yield line, blob
                    line += blob.count(b"\n")
                    pos += len(blob)
                if len(carry) >= block_bytes and (end is None or pos < end):  # a line longer than a block: stream it
                    self._keep_head(carry, whole=False)
                    long = LongLine(line, carry, self.stream, block_bytes)
                    yield long
                    long.drain()
                    carry = long.rest
                    line += 1
                    pos += long.size + 1
        except (OSError, EOFError) as e:
            raise SourceReadError(f"{self.path}: read failed after line {line} ({e})") from None
        if carry and (end is None or pos < end):
            if end is not None and pos + len(carry) > end:  # after a long line: whole lines of the next range too
                carry = carry[:carry.find(b"\n", end - 1 - pos) + 1] or carry
            self._keep_head(carry, whole=True)
            yield line, carry

    def _after_line_at(self, offset: int, block_bytes: int, end: int | None) -> int | None:
        """The offset of the line after the one byte `offset` is in, None when it starts at `end` or after (or
        there is none): that line is read through in chunks, never held (a range's first partial line, which the
        range before reads)."""
        if self.stream is not self.raw:
            raise ValueError(f"{self.path}: a compressed file is read from its start")
        self.raw.seek(offset)
        skipped = LongLine(0, b"", self.stream, block_bytes)
        for _ in skipped.chunks():
            if end is not None and offset + 1 + skipped.size >= end:
                return None
        after = offset + 1 + skipped.size
        return None if end is not None and after >= end else after

    def _keep_head(self, data: bytes, whole: bool) -> None:
        """The first two non-blank lines, for json_array: `data` is whole lines (`whole`) or the beginning of one
        line longer than a block."""
        start = 0
        while len(self._head) < 2 and start < len(data):
            end = data.find(b"\n", start) if whole else -1
            end = len(data) if end < 0 else end
            if line := data[start:end].strip():
                self._head.append((line, whole))
            start = end + 1

    def _first_bytes(self, data: bytes, block_bytes: int) -> tuple[bytes, int]:
        """The file's first bytes read, without a UTF-8 byte order mark (an editor's on Windows; only there: one
        further on is a bad line), and the bytes dropped."""
        while len(data) < len(BOM) and BOM.startswith(data):  # a short read: the BOM may go on
            more = self.stream.read(block_bytes)
            if not more:
                break
            data += more
        if data.startswith(BOM):
            return data[len(BOM):], len(BOM)
        return data, 0

    def blocks(self, block_bytes: int = 1 << 20, max_line_bytes: int = MAX_LINE_BYTES, start: int = 0,
               end: int | None = None) -> Iterator[tuple[int, bytes] | OverLong]:
        """As items(), for a reader that needs each line whole: a long line of at most max_line_bytes joined into a
        block of its own, a longer one read through in chunks and given as an OverLong (never held). Memory: about
        max_line_bytes and two blocks, whatever the line lengths."""
        for item in self.items(block_bytes, start, end):
            if not isinstance(item, LongLine):
                yield item
                continue
            parts: list[bytes] | None = []
            for chunk in item.chunks():
                if parts is not None:
                    parts.append(chunk)
                    if item.size > max_line_bytes:
                        parts = None
            yield (item.line, b"".join(parts) + b"\n") if parts is not None else OverLong(item.line, item.size,
                                                                                          max_line_bytes)

    def close(self) -> None:
        if self.stream is not self.raw:
            self.stream.close()
        self.raw.close()


def compressed(path: str) -> bool:
    """Whether Source reads `path` through a decompressor (fsspec's inference by its name): one stream, no byte
    offsets to cut it at."""
    from fsspec.utils import infer_compression

    return infer_compression(path) is not None


def json_document(first: bytes, whole: bool, second: tuple[bytes, bool] | None = None) -> bool:
    """Whether a file whose first non-blank line is `first` (`whole`: all of it; else the beginning of a line longer
    than a block) and whose second is `second` (the same; None: there is none) is one JSON document of records, an
    array that `jq -c '.[]'` makes JSON lines of: its first line is not JSON by itself (the `[` of a pretty-printed
    array, or `[{...},` of one written an object a line), or is a list of objects (the whole array on one line) and
    is the only line. When the first line and the second are each JSON by themselves, it is JSON lines (a message
    list a line, say), which jq would split into lone messages. Not JSON lines whose lines are arrays of strings or
    numbers either: jq would make lines of bare values of them, still bad lines. A line too long to parse here is
    judged by its beginning: a first line by its first element (an object), a second by its `[` (a list a line, as
    the first; a document's next object begins with `{`)."""
    if not first.startswith(b"["):
        return False
    if not whole:  # too long to parse here: an array whose first element is an object
        return first[1:].lstrip()[:1] == b"{" and not _json_by_itself(second)
    try:
        value = loads_bounded(first)
    except ValueError:
        return True
    records = isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)
    return records and not _json_by_itself(second)


def _json_by_itself(line: tuple[bytes, bool] | None) -> bool:
    """Whether a non-blank line (json_document's `second`) is a JSON value on its own."""
    if line is None:
        return False
    text, whole = line
    if not whole:
        return text[:1] == b"["
    try:
        loads_bounded(text)
    except ValueError:
        return False
    return True


def open_regular(path: str):
    """A local source opened for reading (sources/local.py `open_source`): a link on the way followed only by the one
    link rule (another user's to what is not his: LinkRefused, exit 2), refused (ValueError) unless a regular file,
    never a blocking open (a FIFO nobody writes, in a shared directory, would hang the prepare for good), nor a device
    read. What it leads to is checked on the open file, so no swap between a look and the open."""
    return open_real(path)[0]


def open_real(path: str):
    """(open_regular's file, the real path it was reached at: the link's target, for meta.json to name)."""
    from minilmd.corpus.sources.local import open_source

    fd, real = open_source(path)
    return os.fdopen(fd, "rb"), real


def parse_long_line(long: LongLine, max_chars: int | None = None) -> ParsedBlock:
    """A LongLine as parse_block would see it (the same verdict), its text joined into one string: the first
    `max_chars` characters of it when given, so that a 2 GB line is never held whole (tokenizer training takes
    whole strings; prepare streams the pieces instead)."""
    from minilmd.corpus.sources.longdoc import parse_chunks

    parts: list[str] = []  # the fragments of the text
    held = [0]

    def add(fragment: str) -> None:
        room = len(fragment) if max_chars is None else max_chars - held[0]
        if room > 0:
            parts.append(fragment[:room])
            held[0] += min(room, len(fragment))

    def restart() -> None:
        parts.clear()
        held[0] = 0

    verdict = parse_chunks(long.chunks(), add, restart)
    out = ParsedBlock(n_lines=1)
    if verdict.blank:
        out.blank = 1
    elif verdict.bad:
        out.bad.append((long.line, *verdict.bad))
    else:
        out.texts.append("".join(parts))
        out.lines.append(long.line)
    return out
