"""Reading `{"text": ...}` JSONL corpora: local paths or fsspec URLs, .gz/.zst inferred, in blocks of whole lines.

Shared by `minilmd prepare` and `minilmd tokenizer train`, so that both accept and refuse exactly the same lines.
A line is bad when it is not valid UTF-8, not valid JSON, not an object with a "text" key, or its text is not a
string or is empty (whitespace only counts as empty). Blank lines are not documents; they are counted, not bad.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

BAD_LINE_POLICIES = ("error", "skip")


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


@dataclass
class ParsedBlock:
    texts: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # 1-based line number of each text
    bad: list[tuple[int, str, str]] = field(default_factory=list)  # (line, reason, detail)
    blank: int = 0
    n_lines: int = 0


def parse_block(blob: bytes, first_line: int) -> ParsedBlock:
    """Parse whole lines of JSONL; bad lines are collected with their reason, never used."""
    out = ParsedBlock()
    lines = blob.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out.n_lines = len(lines)
    for i, raw in enumerate(lines):
        lineno = first_line + i
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip():
            out.blank += 1
            continue
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            out.bad.append((lineno, "invalid_utf8", f"byte {e.start}: {raw[e.start:e.start + 4]!r}"))
            continue
        try:
            obj = json.loads(s)
        except ValueError as e:
            out.bad.append((lineno, "invalid_json", str(e)))
            continue
        if not isinstance(obj, dict) or "text" not in obj:
            what = "an object without \"text\"" if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
            out.bad.append((lineno, "missing_text", f"line is {what}"))
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
        import fsspec
        from fsspec.compression import compr
        from fsspec.utils import infer_compression

        self.path = path
        try:
            self.fs, self.fs_path = fsspec.core.url_to_fs(path)
            self.size = self.fs.size(self.fs_path)
            self.raw = self.fs.open(self.fs_path, "rb")
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: cannot open ({e})") from None
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
    def position(self) -> int:
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return 0

    def blocks(self, block_bytes: int = 1 << 20) -> Iterator[tuple[int, bytes]]:
        """(first line number, bytes of whole lines): the last block may lack a final newline."""
        line = 1
        carry = b""
        try:
            while True:
                data = self.stream.read(block_bytes)
                if not data:
                    break
                data = carry + data
                cut = data.rfind(b"\n")
                if cut < 0:  # a line longer than a block: keep reading
                    carry = data
                    continue
                blob, carry = data[:cut + 1], data[cut + 1:]
                yield line, blob
                line += blob.count(b"\n")
        except (OSError, EOFError) as e:
            raise InputError(f"{self.path}: read failed after line {line} ({e})") from None
        if carry:
            yield line, carry

    def close(self) -> None:
        if self.stream is not self.raw:
            self.stream.close()
        self.raw.close()


def iter_texts(sources: list[str], on_bad_line: str = "error", bad_counts: dict | None = None) -> Iterator[str]:
    """Every document text of the sources in order; bad lines raise InputError or are counted in bad_counts."""
    if on_bad_line not in BAD_LINE_POLICIES:
        raise InputError(f"--on-bad-line {on_bad_line!r}: choose one of {', '.join(BAD_LINE_POLICIES)}")
    for path in sources:
        src = Source(path)
        try:
            for first, blob in src.blocks():
                parsed = parse_block(blob, first)
                if parsed.bad:
                    if on_bad_line == "error":
                        raise InputError(str(BadLine(path, *parsed.bad[0])))
                    if bad_counts is not None:
                        for _, reason, _ in parsed.bad:
                            bad_counts[reason] = bad_counts.get(reason, 0) + 1
                yield from parsed.texts
        finally:
            src.close()
