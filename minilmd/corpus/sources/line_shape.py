"""Which format a JSONL line is a line of: the one place that tells a text line, a chat line and a preference pair
apart, so that a reader given another format's lines (`prepare --format dpo` of a chat corpus, `tokenizer train` of
chat data) names each such line for what it is and says once which --format reads them (`advice`), instead of
thousands of lines "to fix". A file that is one JSON document (an array: JSON, not JSON lines) is told here too.
"""
from __future__ import annotations

import shlex
from pathlib import PurePath

from minilmd.raw_corpus import CHAT_KEYS, DPO_KEYS  # the keys a format is told by, beside run --check's own guess

LINE_OF = {"text": "text_line", "chat": "chat_line", "dpo": "dpo_line"}
"""The bad-line reason of a line of that format given to a reader of another."""
EXPECTED = {"text": 'a "text" key', "chat": 'a "conversations" (or "messages") key', "dpo": '"chosen" and "rejected"'}
WHAT = {"text": "text data", "chat": "chat data", "dpo": "a preference pair"}

ADVICE = {
    "chat_line": 'this looks like chat data ({"conversations": [...]} or {"messages": [...]} lines): use --format chat',
    "text_line": 'this looks like a text corpus ({"text": ...} lines): use --format text',
    "dpo_line": 'this looks like preference pairs ({"chosen": [...], "rejected": [...]} lines): use --format dpo',
}
"""What to do when most lines read are of that other format (said once, after the bad lines)."""
FORMAT_OF = {reason: fmt for fmt, reason in LINE_OF.items()}
DESCRIBED = {"chat_line": 'chat data ("conversations" or "messages")', "text_line": 'text ({"text": ...} lines)',
             "dpo_line": 'preference pairs ("chosen" and "rejected")'}


def _found(obj: dict, fmt: str) -> str | None:
    """The keys that make `obj` a line of `fmt`, as said in a bad line's detail (None: not such a line)."""
    if fmt == "dpo":
        return '"chosen" and "rejected"' if all(key in obj for key in DPO_KEYS) else None
    if fmt == "chat":
        return next((f'"{key}"' for key in CHAT_KEYS if key in obj), None)
    return '"text"' if "text" in obj else None


def other_format(obj: object, expected: str) -> tuple[str, str] | None:
    """(reason, detail) of a line that a reader of `expected` ("text", "chat", "dpo") cannot read because it is a
    line of another format (a preference pair first: it is no chat line, whatever else it holds); None otherwise.
    Call it only for a line without the keys `expected` reads."""
    if not isinstance(obj, dict):
        return None
    for fmt in ("dpo", "chat", "text"):
        found = _found(obj, fmt) if fmt != expected else None
        if found:
            return LINE_OF[fmt], f"{EXPECTED[expected]} expected, found {found}: {WHAT[fmt]}"
    return None


def advice(reason: str, into: str = "", into_format: str = "") -> str:
    """What to do about lines of another format (`reason`: a LINE_OF value): the --format that reads them; for an
    append into the corpus `into` (of `into_format`), a corpus of their own."""
    if into:
        return (f"{into} is a {into_format} corpus and this looks like {DESCRIBED[reason]}: prepare it into a corpus "
                f"of its own with --format {FORMAT_OF[reason]}")
    return ADVICE[reason]


def mostly_other_format(counts: dict[str, int], lines_read: int) -> str:
    """The reason (a LINE_OF value) of the lines of another format when they are more than half of the non-blank
    lines read ("" otherwise): the input is in another format, not a few lines to mend."""
    for reason in LINE_OF.values():
        if 2 * counts.get(reason, 0) > lines_read > 0:
            return reason
    return ""


def json_document_advice(paths: list[str]) -> str:
    """What to say of sources that are each one JSON document (an array: jsonl.py json_document), not JSON lines,
    whose lines no reader takes ("" for none)."""
    said = []
    for path in paths:
        where = PurePath(path)
        stem = where.name.removesuffix(".jsonl").removesuffix(".json")
        out = str(where.with_name(stem + (".lines.jsonl" if stem + ".jsonl" == where.name else ".jsonl")))
        said.append(f"{path} is one JSON document (an array), not JSON lines (one object per line): convert it "
                    f"with `jq -c '.[]' {shlex.quote(path)} > {shlex.quote(out)}` and give that file")
    return "\n".join(said)

