"""Encoding chat conversations in prepare's worker processes: a block of chat JSONL lines in, the token ids of
each conversation as its template renders it, its loss mask and its split out (the chat counterpart of
encode.BlockEncoder, returning the same EncodedBlock with masks and per-conversation facts).

The rendered text is encoded whole, without added special tokens (the template writes `<|im_start|>` and
`<|im_end|>` itself), with character offsets: a token is a target when its first character lies inside a target
span of chat.ChatTemplate.targets (found from one rendering where the template allows it: chat_spans.py). A token
that began inside the header and reaches into the reply (a template whose reply starts with whitespace the
header's "\\n" merges with) is therefore not a target. A block's ids, starts and masks are converted and cut at
once (block_ids_and_masks); for a tokenizer whose token starts never decrease (no normalizer: starts_in_order) only
the tokens at each span's two ends are looked up, not every token's offsets (block_ids_and_masks_by_lookup, the
same masks). Each reply's last target token must be `<|im_end|>` (EOS), and the rendering must
start with `<|im_start|>` (BOS): a template that does not is refused line by line (`template_output`).

Length: a conversation longer than seq_len tokens is cut to its first seq_len (as MiniMind does; `cut`) or, with
on_long "drop", dropped (`dropped_long`); one whose targets all fall past the cut is dropped (`dropped_no_target`).
Split: the split rule and leak key of block.py applied to chat.canonical(messages).

Bounds (chat templates are untrusted code, and a conversation is held whole):
- A conversation whose messages hold more text than `text_limit` characters (4 x seq_len x the tokenizer's longest
  token, at least 64 Ki: far more than seq_len tokens can hold, so the cut at seq_len takes only its start) is a bad
  line, `conversation_too_long`, before it is rendered: rendering and encoding cost about 100 bytes per character.
  A line longer than 16 x text_limit bytes is that bad line without being held (`chat_blocks`). Every conversation
  within the bound renders and encodes exactly as before.
- The template renders in the bounded sandbox (minilmd/corpus/chat_sandbox.py), its size bound 4 x text_limit (at
  least 1 Mi); a conversation whose renderings go beyond a bound is a bad line, `template_limit`. When, within one
  block of lines, at least TEMPLATE_STRIKES conversations and more than half of those rendered so far went beyond
  it, the template is the problem, not the lines: prepare stops (InputError, exit 65) saying so.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from minilmd.corpus.chat import ChatTemplate, ParsedChatBlock, TurnError, canonical, has_special_text, parse_chat_block
from minilmd.corpus.chat_sandbox import TemplateLimits
from minilmd.corpus.chat_spans import BlockSpans, Layouts
from minilmd.corpus.prepare.block import NO_DIGEST, EncodedBlock, digest64, leak_key_given
from minilmd.corpus.sources.jsonl import InputError, LongLine
from minilmd.protocol import BOS_ID, EOS_ID

ON_LONG = ("cut", "drop")
FACTS = ("messages", "assistant_turns", "target_tokens", "cut")
"""The columns of the per-conversation facts array (int64) that travel with each split's documents."""
COUNTS = ("cut", "dropped_long", "dropped_no_target", "special_text")
"""The per-block counts of chat conversations (cut ones are kept; `special_text`: a message spells a special
token, which then encodes to id 0, 1 or 2 inside its turn)."""


TEMPLATE_STRIKES = 4
"""Conversations of one block beyond the template's bound (and more than half of those rendered) that stop prepare."""
MIN_TEXT_LIMIT = 1 << 16


def longest_token(tokenizer_json: str) -> int:
    """The most characters one token of the tokenizer stands for (byte-level BPE: bytes; added tokens: their text)."""
    from tokenizers import Tokenizer

    return max(map(len, Tokenizer.from_str(tokenizer_json).get_vocab(with_added_tokens=True)), default=1)


def text_limit(seq_len: int, longest: int) -> int:
    """The most characters of message text a conversation may hold (module docstring)."""
    return max(MIN_TEXT_LIMIT, 4 * seq_len * max(longest, 1))


def _too_long(line: int, what: str, limit: int) -> tuple[int, str, str]:
    return (line, "conversation_too_long", f"{what}, more than the {limit:,} characters of text that seq_len tokens "
                                           "are far from holding; split it into shorter conversations")


def chat_blocks(src, block_bytes: int, limit: int):
    """Source.blocks for chat: (first line, bytes of whole lines), a long line joined into a block of its own, but a
    line longer than 16 x limit bytes is read through and comes as an EncodedBlock holding it as a bad line."""
    for item in src.items(block_bytes):
        if not isinstance(item, LongLine):
            yield item
            continue
        parts, size = [], 0
        for chunk in item.chunks():
            size += len(chunk)
            if size <= 16 * limit:
                parts.append(chunk)
            elif parts:
                parts = []
        if size <= 16 * limit:
            yield item.line, b"".join(parts) + b"\n"
        else:
            yield bad_block(item.line, _too_long(item.line, f"a line of {size:,} bytes", limit))


def bad_block(line: int, bad: tuple[int, str, str]) -> EncodedBlock:
    """The EncodedBlock of one line that is bad."""
    empty = _stack({"tokens": [], "masks": [], "lengths": [], "keys": [], "lines": [], "facts": []})
    return EncodedBlock(
        n_lines=1, blank=0, bad=[bad], text_bytes=0, special_inside=[], train_tokens=empty["tokens"],
        train_lengths=empty["lengths"], train_keys=empty["keys"], val_tokens=empty["tokens"],
        val_lengths=empty["lengths"], val_keys=empty["keys"], val_lines=empty["lines"], train_min_digest=NO_DIGEST,
        train_mask=empty["masks"], val_mask=empty["masks"], train_facts=empty["facts"], val_facts=empty["facts"],
        chat_counts=dict.fromkeys(COUNTS, 0))


def message_chars(messages: list[dict]) -> int:
    return sum(len(m["content"]) + len(m.get("reasoning_content", "")) for m in messages)


@dataclass
class ChatSpec:
    """What a worker needs besides the tokenizer: the template and the length rule."""
    template: ChatTemplate
    seq_len: int
    on_long: str = "cut"


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


def encode_conversation(tok, template: ChatTemplate, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(uint16 ids, uint8 loss mask) of one conversation, whole (no cut). TurnError when the template fails."""
    text, spans = template.targets(messages)
    enc = tok.encode(text, add_special_tokens=False)
    return _ids_and_mask(enc, spans)


def _ids_and_mask(enc, spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
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


def block_ids_and_masks(encs, texts: list[str], spans: list[list[tuple[int, int]]]) -> list:
    """What _ids_and_mask gives each conversation of a block ((ids, mask), or the TurnError it raises), for all of
    them at once: the ids and token starts converted once, and, when every conversation's tokens are in text order
    (byte-level BPE's are), one binary search for all the spans, each conversation's starts offset past the
    previous conversation's text so that the block's starts are in order too; else conversation by conversation."""
    counts = np.fromiter((len(e) for e in encs), dtype=np.int64, count=len(encs))
    bounds = np.concatenate([[0], np.cumsum(counts)])
    total = int(bounds[-1])
    ids = np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=np.uint16, count=total)
    starts = np.fromiter(chain.from_iterable(chain.from_iterable(e.offsets) for e in encs), dtype=np.int64,
                         count=2 * total)[::2]
    base = np.concatenate([[0], np.cumsum([len(t) + 1 for t in texts])])[:len(texts)]
    placed = starts + np.repeat(base, counts)
    out: list = []
    if not bool((placed[1:] >= placed[:-1]).all()):
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
    lo, hi = np.searchsorted(placed, queries[:, 0], side="left"), np.searchsorted(placed, queries[:, 1], side="left")
    edges = np.zeros(total + 1, dtype=np.int64)
    np.add.at(edges, lo, 1)
    np.add.at(edges, hi, -1)
    mask = (np.cumsum(edges[:-1]) > 0).astype(np.uint8)
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
    counts = np.fromiter((len(e) for e in encs), dtype=np.int64, count=len(encs))
    bounds = np.concatenate([[0], np.cumsum(counts)])
    ids = np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=np.uint16, count=int(bounds[-1]))
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


class ChatBlockEncoder:
    """Parse, render, encode, mask and split one block of chat lines. Lives in each worker process."""

    def __init__(self, tokenizer_json: str, val_fraction: float, chat: ChatSpec, one_render: bool = True):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_str(tokenizer_json)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.threshold = int(val_fraction * 2**64)
        self.text_limit = text_limit(chat.seq_len, longest_token(tokenizer_json))
        template = chat.template
        limits = TemplateLimits(template.limits.seconds, max(template.limits.chars, 4 * self.text_limit))
        self.chat = ChatSpec(ChatTemplate(template.source, template.special_tokens, limits), chat.seq_len,
                             chat.on_long)
        # One rendering per conversation where the template allows it (chat_spans.py); None: the prefix way for all.
        self.layouts = Layouts(self.chat.template) if one_render else None
        self.renders_saved = 0
        self.masks = block_ids_and_masks_by_lookup if starts_in_order(self.tok) else block_ids_and_masks

    def __call__(self, blob: bytes, first_line: int) -> EncodedBlock:
        parsed = parse_chat_block(blob, first_line)
        finder = BlockSpans(self.chat.template, self.layouts)
        bad, rendered, kept = self._render(parsed, first_line, finder)
        if finder.mismatch:  # the template is not laid out by the shape of a conversation: the prefix way throughout
            bad, rendered, kept = self._render(parsed, first_line, BlockSpans(self.chat.template, None))
        self.renders_saved += 0 if finder.mismatch else finder.renders_saved
        return self._encode(parsed, bad, rendered, kept)

    def _render(self, parsed: ParsedChatBlock, first_line: int, finder: BlockSpans):
        """(bad lines, (text, spans) and (messages, line) of each conversation rendered)."""
        bad = list(parsed.bad)
        rendered, kept = [], []
        tried = over = 0  # conversations rendered, and those beyond the template's bound
        for messages, line in zip(parsed.conversations, parsed.lines, strict=True):
            chars = message_chars(messages)
            if chars > self.text_limit:
                bad.append(_too_long(line, f"{chars:,} characters of message text", self.text_limit))
                continue
            tried += 1
            try:
                rendered.append(finder.targets(messages))
            except TurnError as e:
                bad.append((line, e.reason, e.detail))
                over += e.reason == "template_limit"
                if over >= TEMPLATE_STRIKES and 2 * over > tried:
                    raise InputError(f"lines {first_line}-{line}: the chat template went beyond its bound on {over} "
                                     f"of {tried} conversations ({e.detail}): the template is the problem, not the "
                                     "lines; nothing was written") from None
                continue
            kept.append((messages, line))
        return bad, rendered, kept

    def _encode(self, parsed: ParsedChatBlock, bad: list, rendered: list, kept: list) -> EncodedBlock:
        texts = [text for text, _ in rendered]
        encoded = self.masks(self.tok.encode_batch(texts, add_special_tokens=False), texts,
                             [spans for _, spans in rendered])
        counts = dict.fromkeys(COUNTS, 0)
        out: dict[bool, dict[str, list]] = {v: {"tokens": [], "masks": [], "lengths": [], "keys": [], "lines": [],
                                                 "facts": []} for v in (False, True)}
        train_min = NO_DIGEST
        text_bytes = 0
        seq_len, drop_long = self.chat.seq_len, self.chat.on_long == "drop"
        # One check of the block's largest id: below the vocabulary, no kept conversation's can reach it.
        check_ids = max((int(got[0].max()) for got in encoded if not isinstance(got, TurnError) and got[0].size),
                        default=0) >= self.vocab_size
        for (messages, line), got in zip(kept, encoded, strict=True):
            if isinstance(got, TurnError):
                bad.append((line, got.reason, got.detail))
                continue
            ids, mask = got
            cut = ids.size > seq_len
            if cut:
                if drop_long:
                    counts["dropped_long"] += 1
                    continue
                ids, mask = ids[:seq_len], mask[:seq_len]
            targets = int(np.count_nonzero(mask))
            if not targets:
                counts["dropped_no_target"] += 1
                continue
            counts["cut"] += int(cut)
            counts["special_text"] += int(has_special_text(messages))
            if check_ids and int(ids.max()) >= self.vocab_size:
                raise ValueError(f"tokenizer produced id {int(ids.max())} >= its vocabulary {self.vocab_size}")
            key_text = canonical(messages)
            data = key_text.encode("utf-8")
            text_bytes += len(data)
            digest = digest64(data)
            is_val = digest < self.threshold
            if not is_val and digest < train_min:
                train_min = digest
            side = out[is_val]
            side["tokens"].append(ids)
            side["masks"].append(mask)
            side["lengths"].append(ids.size)
            side["keys"].append(leak_key_given(key_text, digest))
            side["lines"].append(line)
            side["facts"].append((len(messages), sum(m["role"] == "assistant" for m in messages), targets, int(cut)))
        bad.sort()
        train, val = (_stack(out[v]) for v in (False, True))
        return EncodedBlock(
            n_lines=parsed.n_lines, blank=parsed.blank, bad=bad, text_bytes=text_bytes, special_inside=[],
            train_tokens=train["tokens"], train_lengths=train["lengths"], train_keys=train["keys"],
            val_tokens=val["tokens"], val_lengths=val["lengths"], val_keys=val["keys"], val_lines=val["lines"],
            train_min_digest=train_min, train_mask=train["masks"], val_mask=val["masks"], train_facts=train["facts"],
            val_facts=val["facts"], chat_counts=counts,
        )


def _stack(side: dict[str, list]) -> dict[str, np.ndarray]:
    return {
        "tokens": np.concatenate(side["tokens"]) if side["tokens"] else np.zeros(0, dtype="<u2"),
        "masks": np.concatenate(side["masks"]) if side["masks"] else np.zeros(0, dtype=np.uint8),
        "lengths": np.asarray(side["lengths"], dtype=np.int32),
        "keys": np.asarray(side["keys"], dtype=np.uint64),
        "lines": np.asarray(side["lines"], dtype=np.int64),
        "facts": np.asarray(side["facts"], dtype=np.int64).reshape(-1, len(FACTS)),
    }
