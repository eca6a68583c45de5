"""Which writing systems a text uses: Unicode scripts by code point ranges, for the corpus report and
`prepare --drop-scripts`.

A character belongs to one of SCRIPTS when its code point is in that script's ranges below (the main blocks,
not every rare extension); any other letter (str.isalpha: Thai, Devanagari, Hebrew, ...) is "other". Digits,
punctuation, symbols and whitespace belong to no script and never decide anything. A document's dominant script
is the one with the most characters (ties: the first in SCRIPTS order), "none" when it has no letter at all; it
"contains" every script with at least one character in it. The seed's cleaning rule ("a document with any Greek,
Cyrillic, Arabic or Hangul character is deleted") is `contains`, which is what --drop-scripts applies.

Counting is vectorised over a whole block of texts: their code points (UTF-32) index a table of one byte per
code point (built once per process, ~0.3 s), and a bincount per document sums them; far faster than the
tokenizer, so prepare can afford it on every document.
"""
from __future__ import annotations

import numpy as np

SCRIPTS = ("han", "latin", "kana", "hangul", "cyrillic", "greek", "arabic", "other")
"""The scripts reported, in tie-break order; "other" is every letter of no listed script."""

NONE = "none"
"""The dominant script of a text without any letter (digits and punctuation only)."""

_RANGES = {
    # CJK Unified Ideographs and Extension A, compatibility ideographs, Extensions B-F (astral), the ideographic
    # iteration mark and number zero (〆〇々 are used as Han).
    "han": "\u3005\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef",
    # Basic Latin letters, Latin-1 letters (without x and / signs), Latin Extended-A/B, IPA, Latin Extended
    # Additional, full-width Latin letters.
    "latin": "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0250-\u02af\u1e00-\u1eff\uff21-\uff3a\uff41-\uff5a",
    # Hiragana, Katakana, Katakana Phonetic Extensions, half-width Katakana.
    "kana": "\u3041-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9d",
    # Hangul Jamo, Compatibility Jamo, Jamo Extended-A/B, Syllables, half-width Hangul.
    "hangul": "\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff\uffa0-\uffdc",
    "cyrillic": "\u0400-\u052f\u1c80-\u1c8f\u2de0-\u2dff\ua640-\ua69f",
    # Greek and Coptic letters (not its punctuation), Greek Extended.
    "greek": "\u0370-\u0373\u0376-\u0377\u037b-\u037d\u037f\u0386\u0388-\u03ff\u1f00-\u1fff",
    # Arabic, Arabic Supplement, Extended-A, Presentation Forms A and B.
    "arabic": "\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff\ufe70-\ufeff",
}

_TABLE: np.ndarray | None = None
_COLUMNS = (NONE, *SCRIPTS)  # column 0 counts characters of no script (digits, punctuation, spaces)


def _table() -> np.ndarray:
    """One uint8 per code point: its column in _COLUMNS (0: not a letter of any script)."""
    global _TABLE
    if _TABLE is None:
        table = np.zeros(0x110000, dtype=np.uint8)
        other = _COLUMNS.index("other")
        letters = [i for i in range(0x80, 0x110000) if chr(i).isalpha()]
        table[letters] = other
        for name, chars in _RANGES.items():
            col = _COLUMNS.index(name)
            for lo, hi in _spans(chars):
                table[lo:hi + 1] = col
        _TABLE = table
    return _TABLE


def _spans(chars: str) -> list[tuple[int, int]]:
    """A range string of _RANGES (characters and lo-hi pairs) -> [(lo, hi), ...] of code points, inclusive."""
    spans, i = [], 0
    while i < len(chars):
        if i + 2 < len(chars) and chars[i + 1] == "-":
            spans.append((ord(chars[i]), ord(chars[i + 2])))
            i += 3
        else:
            spans.append((ord(chars[i]), ord(chars[i])))
            i += 1
    return spans


def parse_scripts(value: str) -> frozenset[str]:
    """"greek,cyrillic" -> its scripts; ValueError naming the unknown ones."""
    names = [s.strip().lower() for s in value.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCRIPTS]
    if unknown:
        raise ValueError(f"--drop-scripts: unknown script(s) {', '.join(unknown)}; choose from {', '.join(SCRIPTS)}")
    return frozenset(names)


def script_matrix(texts: list[str]) -> np.ndarray:
    """(len(texts), 1 + len(SCRIPTS)) int64: per text, its characters of no script, then of each of SCRIPTS."""
    n = len(texts)
    if not n:
        return np.zeros((0, len(_COLUMNS)), dtype=np.int64)
    cps = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype="<u4")
    cls = _table()[cps].astype(np.int64)
    doc = np.repeat(np.arange(n, dtype=np.int64), [len(t) for t in texts])
    return np.bincount(doc * len(_COLUMNS) + cls, minlength=n * len(_COLUMNS)).reshape(n, len(_COLUMNS))


def script_counts(text: str) -> dict[str, int]:
    """Characters of each script in `text` (only scripts present)."""
    row = script_matrix([text])[0]
    return {name: int(row[i + 1]) for i, name in enumerate(SCRIPTS) if row[i + 1]}


def dominant_of(matrix: np.ndarray) -> np.ndarray:
    """Per row of script_matrix, the index in SCRIPTS of its dominant script, -1 for no letter (NONE)."""
    letters = matrix[:, 1:]
    top = np.argmax(letters, axis=1)  # argmax takes the first of equals: SCRIPTS order breaks ties
    return np.where(letters.max(axis=1, initial=0) > 0, top, -1)


def containing(matrix: np.ndarray, scripts: frozenset[str]) -> np.ndarray:
    """Per row of script_matrix, whether it has a character of one of `scripts` (the seed's deletion rule)."""
    cols = [SCRIPTS.index(s) + 1 for s in sorted(scripts)]
    if not cols:
        return np.zeros(matrix.shape[0], dtype=bool)
    return np.asarray((matrix[:, cols] > 0).any(axis=1))


class ScriptTally:
    """Documents by dominant script and by "contains any", summed over blocks and merged over workers."""

    def __init__(self) -> None:
        self.documents = 0
        self.dominant = np.zeros(len(SCRIPTS) + 1, dtype=np.int64)  # last: NONE
        self.contains = np.zeros(len(SCRIPTS), dtype=np.int64)

    def add(self, matrix: np.ndarray) -> None:
        self.documents += matrix.shape[0]
        self.dominant += np.bincount(dominant_of(matrix) % (len(SCRIPTS) + 1), minlength=len(SCRIPTS) + 1)
        self.contains += (matrix[:, 1:] > 0).sum(axis=0)

    def merge(self, other: ScriptTally) -> None:
        self.documents += other.documents
        self.dominant += other.dominant
        self.contains += other.contains

    def as_dict(self) -> dict:
        names = [*SCRIPTS, NONE]
        return {"documents": self.documents,
                "dominant": {s: int(n) for s, n in zip(names, self.dominant, strict=True) if n},
                "contains": {s: int(n) for s, n in zip(SCRIPTS, self.contains, strict=True) if n}}
