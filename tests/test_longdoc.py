"""minilmd/corpus/sources/longdoc.py: a line parsed in chunks accepts and refuses exactly what jsonl.parse_block does,
with
the same text; text cut into pieces at its safe cuts tokenizes exactly as the whole text."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_helpers import MINIMIND_TOKENIZER
from minilmd.corpus.sources.jsonl import parse_block
from minilmd.corpus.sources.longdoc import RESTART, LongLineParser, PieceCutter, next_cut, split_pieces


def streamed(line: bytes, sizes: list[int]) -> tuple[str | None, str]:
    """(verdict: "blank", a bad-line reason or None, the text) of LongLineParser fed `line` in chunks of sizes."""
    parser, parts, at = LongLineParser(), [], 0
    for size in sizes:
        if at >= len(line):
            break
        for e in parser.feed(line[at:at + size]):
            parts = [] if e is RESTART else [*parts, e]
        at += size
    if at < len(line):
        for e in parser.feed(line[at:]):
            parts = [] if e is RESTART else [*parts, e]
    events, verdict = parser.close()
    for e in events:
        parts = [] if e is RESTART else [*parts, e]
    if verdict.blank or verdict.bad:
        return "blank" if verdict.blank else verdict.bad[0], ""  # the text of a line that is not a document is void
    return None, "".join(parts)


def whole(line: bytes) -> tuple[str | None, str]:
    parsed = parse_block(line + b"\n", 1)
    if parsed.blank:
        return "blank", ""
    if parsed.bad:
        return parsed.bad[0][1], ""
    return None, parsed.texts[0]


_chars = st.characters(blacklist_categories=("Cs",)) | st.sampled_from(list('"\\/\n\t\r 中文😀\x00\x1f'))
_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) |
                            st.text(_chars, max_size=8),
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                        max_size=3), max_leaves=6)


@st.composite
def lines(draw) -> bytes:
    """JSON lines, most with a "text" (sometimes twice, sometimes not a string), then perhaps broken."""
    members = draw(st.lists(st.tuples(st.sampled_from(["text", "meta", "te\\u0078t", "id"]),
                                      st.text(_chars, max_size=30) | _json_values), max_size=4))
    ascii_only = draw(st.booleans())
    body = ", ".join(f'"{k}": {json.dumps(v, ensure_ascii=ascii_only)}' for k, v in members)
    text = draw(st.sampled_from(["{" + body + "}", "[" + body.replace(": ", ", ") + "]", body, "  {" + body + "}  ",
                                 json.dumps(draw(_json_values))]))
    raw = bytearray(text.encode("utf-8", "surrogatepass"))
    for _ in range(draw(st.integers(0, 2))):  # break it: drop, insert or replace a byte
        if not raw:
            break
        at = draw(st.integers(0, len(raw) - 1))
        op = draw(st.sampled_from(["drop", "insert", "replace"]))
        byte = draw(st.sampled_from(list(b'"\\{}[],: 0e.-\xff\xc3\x80ux') + [0x5c]))
        if op == "drop":
            del raw[at]
        elif op == "insert":
            raw.insert(at, byte)
        else:
            raw[at] = byte
    return bytes(raw).replace(b"\n", b"\\n")


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(line=lines(), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=40))
def test_streamed_verdict_and_text_are_those_of_parse_block(line, sizes):
    assert streamed(line, sizes) == whole(line)


@pytest.mark.parametrize("line", [
    b'{"text": "\\ud83d\\ude00 pair across chunks"}', b'{"text": "\\ud83d lone"}', b'{"text": -Infinity}',
    b'{"text": "a", "text": "b"}', b'{"text": "a", "text": 5}', b'{"n": 1e5, "text": "x", "m": [1.5, -0, NaN]}',
    b'{"text": "x"} {}', b'{"text": "x"', b'{"text": "caf\xc3\xa9"}', b'{"text": "caf\xe9"}', b"  \t ",
    b'{"text": "   "}', b'{"n": 01, "text": "x"}', b'{"n": 1., "text": "x"}', b'"just a string"', b"12",
    b'{"text": "' + b"1" * 5000 + b'", "n": ' + b"9" * 5000 + b"}", b'{"text": "x\\u00"}', b'{"te\\u0078t": "y"}',
])
def test_edge_lines_at_every_chunk_size(line):
    for size in (1, 2, 3, 5, 7, 64):
        assert streamed(line, [size] * len(line)) == whole(line), size


_texts = st.text(st.sampled_from(list("中文字词，。!?abc xyz 12\n\n \t\r\x0b\x1c\xa0\u3000😀'sll-")), max_size=400)


@pytest.fixture(scope="module")
def tokenizers(tokenizer):
    from tokenizers import Tokenizer

    found = [Tokenizer.from_file(str(tokenizer))]
    if MINIMIND_TOKENIZER.is_file():
        found.append(Tokenizer.from_file(str(MINIMIND_TOKENIZER)))
    return found


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_texts, max_chars=st.integers(4, 40), sizes=st.lists(st.integers(1, 50), min_size=1, max_size=30))
def test_safe_cuts_tokenize_exactly_as_the_whole_text_and_streaming_cuts_the_same(tokenizers, text, max_chars,
                                                                                  sizes):
    pieces = split_pieces(text, max_chars) if text else []
    assert "".join(pieces) == text and all(len(p) <= max_chars for p in pieces)
    cutter, got, at = PieceCutter(max_chars), [], 0
    for size in sizes:
        got += cutter.add(text[at:at + size])
        at += size
    got += cutter.add(text[at:]) + cutter.finish()
    assert got == pieces
    starts = [sum(map(len, pieces[:k])) for k in range(len(pieces))]
    if all(next_cut(text, s, max_chars)[1] for s in starts):  # every cut made at a boundary
        for tok in tokenizers:
            whole_ids = tok.encode(text, add_special_tokens=False).ids
            piece_ids = [i for p in pieces for i in tok.encode(p, add_special_tokens=False).ids]
            assert piece_ids == whole_ids
