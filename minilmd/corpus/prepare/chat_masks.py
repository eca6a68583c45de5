"""Loss masks from encodings (prepare --format chat): which tokens of a rendered conversation are targets.

A token is a target when its first character lies inside a target span of chat.ChatTemplate.targets (found from
one rendering where the template allows it: chat_spans.py). A token that began inside the header and reaches into
the reply (a template whose reply starts with whitespace the header's "\\n" merges with) is therefore not a target.
Each reply's last target token must be `<|im_end|>` (EOS), and the rendering must start with `<|im_start|>` (BOS):
a template that does not is refused line by line (`template_output`). Three ways to the same masks, each checked
against the one before it:
- block_ids_and_masks: every token's character offsets, a block's ids, starts and masks converted and cut at once;
- block_ids_and_masks_by_lookup, for a tokenizer whose token starts never decrease (no normalizer:
  starts_in_order): only the tokens at each span's two ends are looked up, not every token's offsets;
- ByteStarts, for a byte-level BPE whose every token stands for a fixed number of bytes of the text (ByteStarts.of):
  a token's first byte is the sum of the lengths before it, so the ids alone place it, and the encoding may skip
  the offsets (encode_batch_fast, about a sixth less of the tokenizer's time). Proven block by block: each
  conversation's tokens must spell exactly its text's bytes, and the first SAMPLED_PER_BLOCK conversations are
  encoded with offsets too and must give the same result by lookup; else the block goes the lookup way, whole.
"""
from __future__ import annotations

from itertools import chain

import numpy as np

from minilmd.corpus.chat import TurnError
from minilmd.protocol import BOS_ID, EOS_ID
from minilmd.untrusted import Unreadable, loads

SAMPLED_PER_BLOCK = 8
"""Conversations of each block that ByteStarts also encodes with offsets, to compare its masks with the lookup's."""


def target_mask(starts: np.ndarray, spans: list[tuple[int, int]]) -> tuple[np.ndarray, list[int | None]]:
    """(uint8 mask of the tokens whose first character, `starts`, lies in one of the [start, end) spans, the index
    of each span's last such token or None). Tokens in text order (byte-level BPE: starts never decrease) are cut
    by binary search; any other order by a scan, with the same result."""
    mask = np.zeros(starts.size, dtype=np.uint8)
    last: list[int | None] = []
    ordered = bool((starts[1:] >= starts[:-1]).all())
    for a, b in spans:
        if ordered:
            lo, hi = (int(x) for x in np.searchsorted(starts, (a, b), side="left"))
            mask[lo:hi] = 1
            last.append(hi - 1 if hi > lo else None)
        else:
            inside = np.flatnonzero((starts >= a) & (starts < b))
            mask[inside] = 1
            last.append(int(inside[-1]) if inside.size else None)
    return mask, last


def ids_and_mask(enc, spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(enc.ids, dtype=np.uint16)
    if not ids.size or ids[0] != BOS_ID:
        raise _no_bos(ids)
    starts = np.fromiter(chain.from_iterable(enc.offsets), dtype=np.int64, count=2 * ids.size)[::2]
    return ids, _mask_checked(ids, starts, spans)


def _no_bos(ids: np.ndarray) -> TurnError:
    return TurnError("template_output", f"the rendering starts with id {int(ids[0]) if ids.size else None}, not "
                                        f"<|im_start|> ({BOS_ID}): minilmd's documents start with BOS")


def _no_eos(k: int) -> TurnError:
    return TurnError("template_output", f"reply {k}'s last target token is not <|im_end|> ({EOS_ID}): the "
                                        "tokenizer does not encode <|im_end|> as one special token")


def _mask_checked(ids: np.ndarray, starts: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    mask, last = target_mask(starts, spans)
    for k, end in enumerate(last):
        if end is None or ids[end] != EOS_ID:
            raise _no_eos(k)
    return mask


def _block_ids(encs) -> tuple[np.ndarray, np.ndarray]:
    """(the block's ids, one after the other, as uint16; the index of each encoding's first id, then the total)."""
    counts = np.fromiter((len(e) for e in encs), dtype=np.int64, count=len(encs))
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=np.uint16, count=int(bounds[-1])), bounds


def block_ids_and_masks(encs, texts: list[str], spans: list[list[tuple[int, int]]]) -> list:
    """What ids_and_mask gives each conversation of a block ((ids, mask), or the TurnError it raises), for all of
    them at once: the ids and token starts converted once, and, when every conversation's tokens are in text order
    (byte-level BPE's are), one binary search for all the spans, each conversation's starts offset past the
    previous conversation's text so that the block's starts are in order too; else conversation by conversation."""
    ids, bounds = _block_ids(encs)
    starts = np.fromiter(chain.from_iterable(chain.from_iterable(e.offsets) for e in encs), dtype=np.int64,
                         count=2 * ids.size)[::2]
    base = np.concatenate([[0], np.cumsum([len(t) + 1 for t in texts])])[:len(texts)]
    placed = starts + np.repeat(base, np.diff(bounds))
    if not bool((placed[1:] >= placed[:-1]).all()):
        out: list = []
        for i, sp in enumerate(spans):
            one, one_starts = ids[bounds[i]:bounds[i + 1]], starts[bounds[i]:bounds[i + 1]]
            try:
                if not one.size or one[0] != BOS_ID:
                    raise _no_bos(one)
                out.append((one, _mask_checked(one, one_starts, sp)))
            except TurnError as refused:
                out.append(refused)
        return out
    queries = np.asarray([(base[i] + a, base[i] + b) for i, sp in enumerate(spans) for a, b in sp],
                         dtype=np.int64).reshape(-1, 2)
    return _cut(ids, bounds, spans, placed, queries)


def _cut(ids: np.ndarray, bounds: np.ndarray, spans: list[list[tuple[int, int]]], placed: np.ndarray,
         queries: np.ndarray) -> list:
    """Each conversation's (ids, mask) or TurnError, from the block's ids, the first token of each conversation
    (bounds), every token's start in one increasing coordinate (placed) and every span's two ends in it (queries,
    (spans, 2)): a token is a target when its start lies in a span."""
    lo, hi = np.searchsorted(placed, queries[:, 0], side="left"), np.searchsorted(placed, queries[:, 1], side="left")
    edges = np.zeros(ids.size + 1, dtype=np.int64)
    np.add.at(edges, lo, 1)
    np.add.at(edges, hi, -1)
    mask = (np.cumsum(edges[:-1]) > 0).astype(np.uint8)
    out: list = []
    q = 0
    for i, sp in enumerate(spans):
        first, end = int(bounds[i]), int(bounds[i + 1])
        error = _no_bos(ids[first:end]) if end == first or ids[first] != BOS_ID else None
        for k in range(len(sp)):
            if error is None and (hi[q + k] <= lo[q + k] or ids[hi[q + k] - 1] != EOS_ID):
                error = _no_eos(k)
        q += len(sp)
        out.append(error if error is not None else (ids[first:end], mask[first:end]))
    return out


def starts_in_order(tok) -> bool:
    """Whether every encoding of `tok` has token starts that never decrease, so that a span's tokens may be found
    by looking up the tokens at its two ends (block_ids_and_masks_by_lookup): a tokenizer without a normalizer
    encodes each special token and each piece its pre-tokenizer cuts one after the other, and its post-processor's
    offset trimming (ByteLevel's trim_offsets) only moves a token's start towards its own end."""
    return tok.normalizer is None


def _tokens_before(enc, n: int, text_len: int, at: int) -> int | None:
    """How many of the n tokens of enc start before character `at`, their starts never decreasing, from at most
    three lookups; None where those do not show it (a token of no width at `at`, a character no token covers)."""
    t = enc.char_to_token(at) if at < text_len else n
    if t is None:
        return None
    if t < n and enc.token_to_chars(t)[0] < at:  # the token holding `at` began before it
        t += 1
        return t if t == n or enc.token_to_chars(t)[0] >= at else None
    return t if t == 0 or enc.token_to_chars(t - 1)[0] < at else None


def block_ids_and_masks_by_lookup(encs, texts: list[str], spans: list[list[tuple[int, int]]]) -> list:
    """block_ids_and_masks for a tokenizer whose starts are in order (starts_in_order), without reading every
    token's offsets: each span's first and last target tokens are looked up at its two ends (_tokens_before), and
    a conversation whose lookups do not show them reads its offsets as before."""
    ids, bounds = _block_ids(encs)
    mask = np.zeros(ids.size, dtype=np.uint8)
    out: list = []
    for i, (enc, text, sp) in enumerate(zip(encs, texts, spans, strict=True)):
        first, end = int(bounds[i]), int(bounds[i + 1])
        one = ids[first:end]
        if end == first or one[0] != BOS_ID:
            out.append(_no_bos(one))
            continue
        found = [_tokens_before(enc, end - first, len(text), at) for span in sp for at in span]
        cuts = [c for c in found if c is not None]
        if len(cuts) < len(found):
            starts = np.fromiter(chain.from_iterable(enc.offsets), dtype=np.int64, count=2 * one.size)[::2]
            try:
                out.append((one, _mask_checked(one, starts, sp)))
            except TurnError as refused:
                out.append(refused)
            continue
        error = None
        for k in range(len(sp)):
            lo, hi = cuts[2 * k], cuts[2 * k + 1]
            mask[first + lo:first + hi] = 1
            if error is None and (hi <= lo or one[hi - 1] != EOS_ID):
                error = _no_eos(k)
        out.append(error if error is not None else (one, mask[first:end]))
    return out


class ByteStarts:
    """The byte length of each token id of a byte-level BPE tokenizer, and the masks of a block from its ids alone
    (module docstring). `of` says whether a tokenizer is one; `fallbacks` counts the blocks that went the lookup
    way."""

    def __init__(self, lengths: np.ndarray):
        self.lengths = lengths  # int64, bytes of text per token id, all > 0
        self.fallbacks = 0

    @classmethod
    def of(cls, tok, tokenizer_json: str) -> ByteStarts | None:
        """ByteStarts for a tokenizer whose tokens spell the text's bytes one after the other: no normalizer and no
        post-processor (either may move or change text), a BPE model without subword affixes, pre-tokenizers that
        only split (ByteLevel without an added prefix space, Split that keeps what it splits on), every vocabulary
        token spelt in ByteLevel's alphabet (one character per byte), no added token that takes the white space
        beside it (lstrip, rstrip). None for any other (the lookup way)."""
        from tokenizers import pre_tokenizers

        if not hasattr(tok, "encode_batch_fast"):
            return None
        try:  # the text the tokenizer was built from (read_tokenizer_text bounded it): never a RecursionError
            spec = loads(tokenizer_json, expect=dict)
        except Unreadable:
            return None
        model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
        pres = (pre.get("pretokenizers") or []) if pre.get("type") == "Sequence" else [pre]
        if (spec.get("normalizer") is not None or spec.get("post_processor") is not None
                or model.get("type") != "BPE" or model.get("continuing_subword_prefix")
                or model.get("end_of_word_suffix") or not any(p.get("type") == "ByteLevel" for p in pres)
                or any(p.get("type") not in ("ByteLevel", "Split") or p.get("add_prefix_space")
                       or p.get("behavior") == "Removed" for p in pres)):
            return None
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        lengths = np.zeros(tok.get_vocab_size(with_added_tokens=True), dtype=np.int64)
        for text, i in tok.get_vocab(with_added_tokens=False).items():
            if not set(text) <= alphabet:
                return None
            lengths[i] = len(text)
        for i, added in tok.get_added_tokens_decoder().items():
            if added.lstrip or added.rstrip:
                return None
            lengths[i] = len(added.content.encode("utf-8"))
        return cls(lengths) if bool((lengths > 0).all()) else None

    def masks(self, tok, texts: list[str], spans: list[list[tuple[int, int]]], fallback) -> list:
        """What fallback(tok.encode_batch(texts), texts, spans) gives (block_ids_and_masks_by_lookup), from
        encode_batch_fast and the ids' byte lengths where the block's check and sample allow it."""
        got = self._from_ids(tok.encode_batch_fast(texts, add_special_tokens=False), texts, spans)
        if got is not None:
            k = min(SAMPLED_PER_BLOCK, len(texts))
            if same_results(fallback(tok.encode_batch(texts[:k], add_special_tokens=False), texts[:k], spans[:k]),
                            got[:k]):
                return got
        self.fallbacks += 1
        return fallback(tok.encode_batch(texts, add_special_tokens=False), texts, spans)

    def _from_ids(self, encs, texts: list[str], spans: list[list[tuple[int, int]]]) -> list | None:
        """The block's results from the ids, None when its tokens do not spell its texts byte for byte. Tokens and
        characters are placed in the bytes of all the texts one after the other: a token is a target when its
        first byte lies in a span's bytes, which holds exactly when its first character lies in the span's
        characters (a span's ends are character boundaries; a token that starts inside a character starts inside
        it by both counts)."""
        ids, bounds = _block_ids(encs)
        if ids.size and int(ids.max()) >= self.lengths.size:
            return None
        token_bytes = np.concatenate([[0], np.cumsum(self.lengths[ids])])  # each token's first byte, then the end
        try:
            points = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
        except UnicodeEncodeError:  # a lone surrogate a template wrote: no UTF-8 to count
            return None
        widths = 1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000)
        char_bytes = np.concatenate([[0], np.cumsum(widths)])  # each character's first byte, then the end
        text_base = np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64)
        if not np.array_equal(token_bytes[bounds], char_bytes[text_base]):
            return None
        queries = np.asarray([(text_base[i] + a, text_base[i] + b) for i, sp in enumerate(spans) for a, b in sp],
                             dtype=np.int64).reshape(-1, 2)
        return _cut(ids, bounds, spans, token_bytes[:-1], char_bytes[queries])


def same_results(want: list, got: list) -> bool:
    """Whether two lists of block results hold the same (ids, mask) pairs and the same refusals."""
    for w, g in zip(want, got, strict=True):
        if isinstance(w, TurnError) or isinstance(g, TurnError):
            if not (isinstance(w, TurnError) and isinstance(g, TurnError) and (w.reason, w.detail) == (g.reason,
                                                                                                       g.detail)):
                return False
        elif w[0].tobytes() != g[0].tobytes() or w[1].tobytes() != g[1].tobytes():
            return False
    return True
