"""The texts `minilmd tokenizer train` learns from: every document text of its JSONL sources, read as prepare reads
them (minilmd/corpus/sources/jsonl.py: the same lines accepted and refused), each cut to TRAIN_TEXT_CHARS, and what
it says once after its bad lines.
"""
from __future__ import annotations

from collections.abc import Iterator

from minilmd.corpus.sources.bad_tally import BadLineTally, InputError
from minilmd.corpus.sources.jsonl import (
    BAD_LINE_POLICIES,
    CHAT_LINE,
    DPO_LINE,
    LongLine,
    Source,
    parse_block,
    parse_long_line,
)
from minilmd.corpus.sources.line_shape import json_document_advice
from minilmd.corpus.sources.source_list import source_sizes

TRAIN_TEXT_CHARS = 1 << 24
"""What iter_texts (tokenizer training) takes of one document, at most: its first 16 Mi characters. BPE learns from
word counts, which a longer text only adds to; holding a 2 GB line whole (and the tokenizers library's copy) is
what the bound prevents."""


TOKENIZER_CHAT_ADVICE = ('tokenizer train reads the "text" of {"text": ...} lines: train the tokenizer on text (the '
                         "pretraining corpus), or fine-tune with the tokenizer of the model you start from")


def iter_texts(sources: list[str], on_bad_line: str = "error", bad=None, progress=None) -> Iterator[str]:
    """Every document text of the sources in order (a text longer than TRAIN_TEXT_CHARS: its beginning). Every bad
    line is counted and named in `bad` (a bad_tally.BadLineTally, prepare's rule; a fresh one when None): under
    `skip` it is left out; under `error` no text is given after the first one, the rest of the input is read for
    its bad lines alone, and InputError names them all at the end (as prepare: every bad line in one run, and
    tokenizer training never starts on a corpus it refuses). InputError too when the input holds no document at
    all (an empty file: prepare's `no documents`), rather than a tokenizer of the 256 bytes alone. The sources are
    checked and measured up front, as prepare's are (source_list.py), then read one at a time, one open at once;
    `progress` (a minilmd/corpus/progress.py Progress) is told their bytes then, and the bytes and documents read as
    they are, as prepare's is."""
    if on_bad_line not in BAD_LINE_POLICIES:
        raise InputError(f"--on-bad-line {on_bad_line!r}: choose one of {', '.join(BAD_LINE_POLICIES)}")
    bad = BadLineTally() if bad is None else bad
    documents = done_before = 0  # done_before: the bytes of the sources already read
    total = sum(source_sizes(sources))  # every source checked up front, as prepare's; none held open
    if progress:
        progress.total = total
    for path in sources:
        src = Source(path)
        read, bad_before = 0, bad.total  # this source's non-blank lines; the bad lines before it
        try:
            for item in src.items():
                parsed = parse_long_line(item, TRAIN_TEXT_CHARS) if isinstance(item, LongLine) else parse_block(
                    item[1], item[0])
                read += parsed.n_lines - parsed.blank
                for line, reason, detail in parsed.bad:
                    bad.add(path, line, reason, detail)
                if progress:
                    progress.update(done_before + src.position, None, documents)
                if bad.total and on_bad_line == "error":
                    continue  # refused: read on for the other bad lines only
                documents += len(parsed.texts)
                yield from parsed.texts
        finally:
            src.close()
        done_before += src.size
        if src.json_array and 2 * (bad.total - bad_before) > read:
            bad.json_documents.append(path)
    hint = tokenizer_hint(bad)
    if bad.total and on_bad_line == "error":
        raise bad.error(hint)
    if not documents:
        raise InputError(f"{', '.join(sources)}: no documents (every line was blank or bad)" + f"; {hint}" * bool(hint))
    if progress:  # read to the end, and taken: the refusals above are the last word otherwise
        progress.update(done_before, None, documents, force=True)


def tokenizer_hint(bad: BadLineTally) -> str:
    """What tokenizer train says once after its bad lines: a JSON document given for JSON lines, chat data or
    preference pairs given for text (TOKENIZER_CHAT_ADVICE)."""
    said = [json_document_advice(bad.json_documents)] if bad.json_documents else []
    if CHAT_LINE in bad.counts or DPO_LINE in bad.counts:
        said.append(TOKENIZER_CHAT_ADVICE)
    return "\n".join(said)
