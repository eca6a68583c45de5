"""Documents too long to hold: a JSONL line read in chunks, its "text" decoded and cut into pieces as it streams.

`minilmd prepare` reads whole lines in blocks; a line longer than a block (a 50 MB book on one line) goes through
here instead, so that memory stays bounded by the block and piece sizes whatever the document's size:
- `LongLineParser` checks one line fed in raw chunks against exactly what `jsonl.parse_block` accepts (UTF-8, one
  JSON value nested at most MAX_JSON_DEPTH deep, an object with a string "text" that is not blank, no lone
  surrogate; the last "text" key wins, as with json.loads) and hands out the decoded text in fragments; only a
  few characters of the line are ever kept.
- `next_cut` decides where a text is cut into pieces of at most PIECE_CHARS characters for the tokenizer, the same
  way for a text held whole (in a block) and for one streamed here, so that a document's tokens do not depend on
  the path it took. Cuts are made in the second half of the piece, in order of preference: after a newline that
  stands alone between two non-space characters (a paragraph), or before a single space between two non-space
  characters (a word). For byte-level BPE with GPT-2-style pre-tokenization (MiniMind's tokenizer, `minilmd
  tokenizer train`'s, Qwen's) both are boundaries of the pre-tokenizer, with the same pre-tokens on both sides
  whether the text goes on or not (a run of several whitespace characters is not: at a piece's end it would become
  one pre-token), and BPE never merges across them: the tokens are exactly those of the whole text. Only a stretch
  of PIECE_CHARS // 2 characters with neither (one "word" that long) is cut at the piece limit, and no token spans
  that cut. docs/formats.md says the same for the operator.
"""
from __future__ import annotations

import codecs
import re
import sys
from dataclasses import dataclass
from json import decoder as _json_decoder

from minilmd.untrusted import MAX_LINE_DEPTH as MAX_JSON_DEPTH

PIECE_CHARS = 1 << 18
"""The most characters the tokenizer is given at once (its working memory is a few hundred bytes per character)."""
RESTART = None
"""Event of LongLineParser.feed: another top-level "text" key follows; the text so far does not count (the last
one wins, as with json.loads)."""

_scanstring = _json_decoder.scanstring  # type: ignore[attr-defined]  # json's own (C) string decoder; not in typeshed
_WS = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
_STRING_RUN = re.compile(r'(?:[^"\\\x00-\x1f]+|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*')
_DIGITS = re.compile(r"[0-9]*")
_HIGH_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")
_LITERALS = {"t": ("true", "bool"), "f": ("false", "bool"), "n": ("null", "NoneType"), "N": ("NaN", "float"),
             "I": ("Infinity", "float")}
_BLANK_BYTES = b" \t\n\r\x0b\x0c"  # what bytes.strip() removes: a line of these is blank, as in parse_block
_MAX_INT_DIGITS = getattr(sys, "get_int_max_str_digits", lambda: 0)()  # json.loads refuses longer ints (3.11+)


def next_cut(text: str, start: int, max_chars: int = PIECE_CHARS) -> tuple[int, bool]:
    """(end of the piece of `text` that starts at `start`, whether the cut is a pre-tokenizer boundary). The rest
    when it fits in max_chars. Looks at text[start:start + max_chars + 1] only: a streaming caller cuts once it
    holds more than that (or the end of the text), and gets the cuts of the whole text."""
    end = start + max_chars
    if len(text) <= end:
        return len(text), True
    lo = start + max_chars // 2
    q = text.rfind("\n", lo + 1, end)
    while q > lo:
        if not text[q - 1].isspace() and not text[q + 1].isspace():
            return q + 1, True
        q = text.rfind("\n", lo + 1, q)
    q = text.rfind(" ", lo + 1, end)
    while q > lo:
        if not text[q - 1].isspace() and not text[q + 1].isspace():
            return q, True
        q = text.rfind(" ", lo + 1, q)
    return end, False


def split_pieces(text: str, max_chars: int = PIECE_CHARS) -> list[str]:
    """The pieces `next_cut` makes of a text held whole."""
    if len(text) <= max_chars:
        return [text]
    pieces, start = [], 0
    while start < len(text):
        end, _ = next_cut(text, start, max_chars)
        pieces.append(text[start:end])
        start = end
    return pieces


class PieceCutter:
    """Text fragments in, pieces out: the same cuts as split_pieces on the whole text, holding only what it has not
    handed out (less than max_chars + 2 characters, plus the last fragment)."""

    def __init__(self, max_chars: int = PIECE_CHARS):
        self.max_chars = max_chars
        self.buf = ""

    def add(self, fragment: str) -> list[str]:
        self.buf += fragment
        pieces = []
        while len(self.buf) > self.max_chars + 1:
            end, _ = next_cut(self.buf, 0, self.max_chars)
            pieces.append(self.buf[:end])
            self.buf = self.buf[end:]
        return pieces

    def finish(self) -> list[str]:
        pieces = []
        while self.buf:
            end, _ = next_cut(self.buf, 0, self.max_chars)
            pieces.append(self.buf[:end])
            self.buf = self.buf[end:]
        return pieces


@dataclass
class LineVerdict:
    """What a streamed line turned out to be: blank, bad (reason and detail, as parse_block names them), or else a
    document whose text went out in fragments."""
    blank: bool = False
    bad: tuple[str, str] | None = None


class _JSONError(Exception):
    pass


def parse_chunks(chunks, on_text, on_restart) -> LineVerdict:
    """Feed a line's raw chunks through a LongLineParser: `on_text(fragment)` for each fragment of the top-level
    "text" string, `on_restart()` when another top-level "text" starts over (the last one is the document).
    Returns the line's verdict."""
    parser = LongLineParser()

    def take(events: list) -> None:
        for event in events:
            if event is RESTART:
                on_restart()
            else:
                on_text(event)

    for chunk in chunks:
        take(parser.feed(chunk))
    events, verdict = parser.close()
    take(events)
    return verdict


class LongLineParser:
    """One JSONL line fed in raw chunks. `feed(chunk)` returns the events so far: text fragments of the top-level
    "text" string, in order, and RESTART when another top-level "text" key begins; `close()` the remaining events
    and the verdict. Holds only an incomplete token (a few characters) between calls."""

    def __init__(self):
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.fed_bytes = 0
        self.blank = True
        self.utf8_error: str | None = None
        self.json_error: str | None = None
        self.buf = ""  # decoded characters not parsed yet (an incomplete token)
        self.pos = 0  # characters of the line before buf, for error messages
        self.events: list = []
        # the parse: the open containers, what may come next, the string / literal / number under way
        self.stack: list[str] = []
        self.expect = "value"  # value, value_or_end, key, key_or_end, colon, comma_or_end, end
        self.string: str | None = None  # what the string being read is: "key", "text" or "other"
        self.literal: str | None = None  # the rest of a literal being read (true, false, null, NaN, Infinity)
        self.number: str | None = None  # the state of a number being read
        self.int_digits = 0
        self.is_float = False
        self.value_is_text = False  # the value being read is the top-level "text"
        self.key = ""  # the start of the key being read: enough to tell "text"
        self.top_type: str | None = None  # the Python type name of the line's value, as parse_block names it
        self.seen_text = False
        self.text_type: str | None = None  # of the last top-level "text" value
        self.text_chars = 0
        self.text_has_content = False
        self.surrogate: str | None = None  # the first lone surrogate of that text

    # -- input ----------------------------------------------------------------------------------------------------
    def feed(self, chunk: bytes) -> list:
        if self.blank and chunk.strip(_BLANK_BYTES):
            self.blank = False
        self._parse(self._decode(chunk, final=False), final=False)
        self.fed_bytes += len(chunk)
        events, self.events = self.events, []
        return events

    def close(self) -> tuple[list, LineVerdict]:
        self._parse(self._decode(b"", final=True), final=True)
        return self.events, self._verdict()

    def _verdict(self) -> LineVerdict:
        """The first problem in parse_block's order of checks."""
        if self.blank:
            return LineVerdict(blank=True)
        if self.utf8_error:
            return LineVerdict(bad=("invalid_utf8", self.utf8_error))
        if self.json_error:
            return LineVerdict(bad=("invalid_json", self.json_error))
        if self.top_type != "dict" or not self.seen_text:
            what = "an object without \"text\"" if self.top_type == "dict" else f"a JSON {self.top_type}"
            return LineVerdict(bad=("missing_text", f"line is {what}"))
        if self.text_type != "str":
            return LineVerdict(bad=("text_not_string", f"\"text\" is a JSON {self.text_type}"))
        if not self.text_has_content:
            return LineVerdict(bad=("empty_text", "\"text\" is empty or whitespace"))
        if self.surrogate:
            return LineVerdict(bad=("invalid_utf8", self.surrogate))
        return LineVerdict()

    def _decode(self, chunk: bytes, final: bool) -> str:
        if self.utf8_error:
            return ""
        pending = len(self.decoder.getstate()[0])  # bytes of a character begun in the previous chunk
        try:
            return self.decoder.decode(chunk, final)
        except UnicodeDecodeError as e:
            self.utf8_error = f"byte {self.fed_bytes - pending + e.start}: {e.object[e.start:e.start + 4]!r}"
            return ""

    def _parse(self, text: str, final: bool) -> None:
        if self.json_error or self.utf8_error:
            return  # the rest of the line is only decoded: an invalid byte later still makes it invalid_utf8
        self.buf += text
        try:
            i = self._run(final)
            if final:
                self._at_end()
        except _JSONError as e:
            self.json_error = str(e)
            self.buf = ""
            return
        self.pos += i
        self.buf = self.buf[i:]

    def _fail(self, what: str, at: int) -> None:
        raise _JSONError(f"{what}: character {self.pos + at}")

    # -- the grammar ----------------------------------------------------------------------------------------------
    def _run(self, final: bool) -> int:
        """Parse buf as far as it goes; the index of the first character not consumed."""
        buf, i, n = self.buf, 0, len(self.buf)
        while True:
            if self.string is not None:
                i = self._in_string(buf, i, final)
                if self.string is not None:
                    return i  # the string goes on in the next chunk
                continue
            if self.literal is not None:
                i = self._in_literal(buf, i, final)
                if self.literal is not None:
                    return i
                continue
            if self.number is not None:
                i = self._in_number(buf, i, final)
                if self.number is not None:
                    return i
                continue  # the number ended (or turned out to be -Infinity)
            i = _match_end(_WS, buf, i)
            if i >= n:
                return i
            c, expect = buf[i], self.expect
            if expect == "value" or expect == "value_or_end" and c != "]":
                self._start_value(c, i)
                i += c in '"{['  # a number or a literal is read from its first character on
            elif expect == "value_or_end" or expect == "key_or_end" and c == "}":
                self._end_container()
                i += 1
            elif expect in ("key", "key_or_end"):
                if c != '"':
                    self._fail("Expecting property name enclosed in double quotes", i)
                self.string, self.key = "key", ""
                i += 1
            elif expect == "colon":
                if c != ":":
                    self._fail("Expecting ':' delimiter", i)
                self.expect = "value"
                i += 1
            elif expect == "comma_or_end":
                if c == ",":
                    self.expect = "key" if self.stack[-1] == "{" else "value"
                elif c == ("}" if self.stack[-1] == "{" else "]"):
                    self._end_container()
                else:
                    self._fail("Expecting ',' delimiter", i)
                i += 1
            else:  # "end": only whitespace may follow the line's value
                self._fail("Extra data", i)

    def _start_value(self, c: str, i: int) -> None:
        self.value_is_text = self.stack == ["{"] and self.key == "text" and self.expect == "value"
        if c == '"':
            self._typed("str")
            self.string = "text" if self.value_is_text else "other"
        elif c in "{[":
            if len(self.stack) >= MAX_JSON_DEPTH:  # as jsonl.loads_bounded refuses it
                self._fail(f"nested deeper than {MAX_JSON_DEPTH} arrays and objects", i)
            self._typed("dict" if c == "{" else "list")
            self.stack.append(c)
            self.expect = "key_or_end" if c == "{" else "value_or_end"
        elif c == "-" or "0" <= c <= "9":
            self.number, self.int_digits, self.is_float = "start", 0, False
        elif c in _LITERALS:
            self.literal, kind = _LITERALS[c]
            self._typed(kind)
        else:
            self._fail("Expecting value", i)

    def _typed(self, kind: str) -> None:
        if not self.stack:
            self.top_type = kind
        if self.value_is_text:
            self.text_type = kind

    def _value_done(self) -> None:
        self.value_is_text = False
        self.expect = "comma_or_end" if self.stack else "end"

    def _end_container(self) -> None:
        self.stack.pop()
        self._value_done()

    def _in_string(self, buf: str, i: int, final: bool) -> int:
        n = len(buf)
        j = _match_end(_STRING_RUN, buf, i)
        if j < n and buf[j] == '"':
            self._string_part(buf, i, j)
            self._string_done()
            return j + 1
        if final or j < n and not (buf[j] == "\\" and n - j < 6 and _could_be_escape(buf[j:])):
            if j >= n:
                self._fail("Unterminated string starting at", i)
            self._fail("Invalid \\escape" if buf[j] == "\\" else "Invalid control character", j)
        # more input needed; a high surrogate at the end waits for its low half, which may come next
        if j - i >= 6 and _HIGH_SURROGATE_ESCAPE.fullmatch(buf, j - 6, j) and _escape_starts(buf, j - 6, i):
            j -= 6
        self._string_part(buf, i, j)
        return j

    def _string_part(self, buf: str, i: int, j: int) -> None:
        if j <= i or self.string == "other":
            return
        part = _scanstring(buf[i:j] + '"', 0, True)[0]
        if self.string == "key":
            if len(self.key) <= 4:
                self.key += part[:5]
            return
        if not self.text_has_content and part.strip():
            self.text_has_content = True
        if self.surrogate is None:
            try:
                part.encode("utf-8")
            except UnicodeEncodeError as e:
                self.surrogate = f"lone surrogate {part[e.start]!r} at character {self.text_chars + e.start}"
        self.text_chars += len(part)
        self.events.append(part)

    def _string_done(self) -> None:
        role, self.string = self.string, None
        if role != "key":
            self._value_done()
            return
        if len(self.key) > 4:
            self.key = ""
        if self.stack == ["{"] and self.key == "text":
            if self.seen_text:  # the last "text" wins, as with json.loads
                self.events.append(RESTART)
                self.text_type, self.text_chars, self.text_has_content, self.surrogate = None, 0, False, None
            self.seen_text = True
        self.expect = "colon"

    def _in_literal(self, buf: str, i: int, final: bool) -> int:
        rest = self.literal or ""
        take = min(len(rest), len(buf) - i)
        if buf[i:i + take] != rest[:take]:
            self._fail("Expecting value", i)
        self.literal = rest[take:] or None
        if self.literal is None:
            self._value_done()
        elif final:
            self._fail("Expecting value", i)
        return i + take

    def _in_number(self, buf: str, i: int, final: bool) -> int:
        """Python's json number, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?, or -Infinity. Anything else after
        a "-", ".", "e" or sign makes the line invalid (json.loads stops the number there and fails on the rest)."""
        n = len(buf)
        while i < n:
            state, c = self.number, buf[i]
            digit = "0" <= c <= "9"
            if state == "start" and c == "-":
                self.number, i = "minus", i + 1
            elif state in ("start", "minus"):
                if state == "minus" and c == "I":
                    self.number, self.literal = None, "Infinity"
                    self._typed("float")
                    return i
                if not digit:
                    self._fail("Expecting value", i)
                self.number, self.int_digits, i = "int0" if c == "0" else "int", 1, i + 1
            elif state in ("int", "frac", "exp") and digit:
                j = _match_end(_DIGITS, buf, i)
                if state == "int":
                    self.int_digits += j - i
                i = j
            elif state in ("int", "int0") and c == "." or state in ("int", "int0", "frac") and c in "eE":
                self.number, self.is_float, i = ("dot" if c == "." else "e"), True, i + 1
            elif state in ("dot", "e", "e_sign"):
                if state == "e" and c in "+-":
                    self.number, i = "e_sign", i + 1
                    continue
                if not digit:
                    self._fail("Expecting a digit in a number", i)
                self.number = "frac" if state == "dot" else "exp"
            else:
                self._number_done(i)
                return i
        if final:
            if self.number in ("start", "minus", "dot", "e", "e_sign"):
                self._fail("Unterminated number", i)
            self._number_done(i)
        return i

    def _number_done(self, i: int) -> None:
        if not self.is_float and _MAX_INT_DIGITS and self.int_digits > _MAX_INT_DIGITS:
            self._fail(f"Exceeds the limit ({_MAX_INT_DIGITS} digits) for integer string conversion", i)
        self.number = None
        self._typed("float" if self.is_float else "int")
        self._value_done()

    def _at_end(self) -> None:
        if self.expect != "end":
            self._fail("Expecting value" if self.expect == "value" else "Unexpected end of the line", len(self.buf))


def _match_end(pattern: re.Pattern, buf: str, i: int) -> int:
    """Where a pattern that may match nothing (X*) stops matching from i."""
    m = pattern.match(buf, i)
    return m.end() if m else i


def _escape_starts(buf: str, at: int, floor: int) -> bool:
    """Whether the backslash at buf[at] begins an escape: an even number of backslashes before it (from floor)."""
    k = at - 1
    while k >= floor and buf[k] == "\\":
        k -= 1
    return (at - 1 - k) % 2 == 0


def _could_be_escape(tail: str) -> bool:
    """Whether `tail`, a backslash and fewer than 5 characters after it, may become a valid escape."""
    if len(tail) == 1:
        return True
    return tail[1] == "u" and all(c in "0123456789abcdefABCDEF" for c in tail[2:])
