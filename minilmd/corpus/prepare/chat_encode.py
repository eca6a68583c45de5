"""Encoding chat conversations in prepare's worker processes: a block of chat JSONL lines in, the token ids of
each conversation as its template renders it, its loss mask and its split out (the chat counterpart of
encode.BlockEncoder, returning the same EncodedBlock with masks and per-conversation facts).

The rendered text is encoded whole, without added special tokens (the template writes `<|im_start|>` and
`<|im_end|>` itself), and its loss mask found from the encoding (chat_masks.py: the targets of
chat.ChatTemplate.targets, whose spans come from one rendering where the template allows it, chat_spans.py).

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
  least 1 Mi), its time bound the rendering's own CPU time scaled to the messages rendered (so that neither the
  machine's load nor a conversation's length makes a valid conversation late); a conversation whose renderings go
  beyond a bound is a bad line, `template_limit`, its detail naming the bound and the messages rendered. When,
  within one block of lines, at least TEMPLATE_STRIKES conversations and more than half of those rendered so far
  went beyond it, the template is the problem, not the lines: prepare stops (InputError, exit 65) saying so.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from minilmd.corpus.analysis.stats import FACTS
from minilmd.corpus.chat import ChatTemplate, ParsedChatBlock, TurnError, canonical, has_special_text, parse_chat_block
from minilmd.corpus.chat_spans import BlockSpans, Layouts
from minilmd.corpus.chat_tools import tool_text
from minilmd.corpus.prepare.block import NO_DIGEST, EncodedBlock, digest64, leak_key_given
from minilmd.corpus.prepare.chat_masks import (
    ByteStarts,
    block_ids_and_masks,
    block_ids_and_masks_by_lookup,
    ids_and_mask,
    starts_in_order,
)
from minilmd.corpus.sources.jsonl import InputError, OverLong

ON_LONG = ("cut", "drop")
COUNTS = ("cut", "dropped_long", "dropped_no_target", "special_text", "ignored_keys")
"""The per-block counts of chat conversations (cut ones are kept; `special_text`: a message spells a special
token, which then encodes to id 0, 1 or 2 inside its turn; `ignored_keys`: one kept without keys its template never
renders, chat.check_conversation's `ignored`)."""


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
    """Source.blocks with chat's bound: (first line, bytes of whole lines), a long line joined into a block of its
    own, but a line longer than 16 x limit bytes is read through and comes as an EncodedBlock holding it as a bad
    line, named as a conversation too long for seq_len."""
    for item in src.blocks(block_bytes, 16 * limit):
        if isinstance(item, OverLong):
            yield bad_block(item.line, _too_long(item.line, f"a line of {item.size:,} bytes", limit))
        else:
            yield item


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
    """A conversation's text: its contents, thoughts, and tool specs and calls as compact JSON (chat_tools)."""
    return sum(len(m["content"]) + len(m.get("reasoning_content", "")) + len(tool_text(m)) for m in messages)


@dataclass
class ChatSpec:
    """What a worker needs besides the tokenizer: the template and the length rule."""
    template: ChatTemplate
    seq_len: int
    on_long: str = "cut"
    pairs: bool = False
    """--format dpo: each line a preference pair (dpo_encode.PairBlockEncoder)."""


def encode_conversation(tok, template: ChatTemplate, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(uint16 ids, uint8 loss mask) of one conversation, whole (no cut). TurnError when the template fails."""
    text, spans = template.targets(messages)
    enc = tok.encode(text, add_special_tokens=False)
    return ids_and_mask(enc, spans)


class ChatBlockEncoder:
    """Parse, render, encode, mask and split one block of chat lines. Lives in each worker process."""

    def __init__(self, tokenizer_json: str, val_fraction: float, chat: ChatSpec, one_render: bool = True,
                 by_bytes: bool = True):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_str(tokenizer_json)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.threshold = int(val_fraction * 2**64)
        self.text_limit = text_limit(chat.seq_len, longest_token(tokenizer_json))
        template = chat.template
        limits = replace(template.limits, chars=max(template.limits.chars, 4 * self.text_limit))
        self.chat = ChatSpec(ChatTemplate(template.source, template.special_tokens, limits), chat.seq_len,
                             chat.on_long)
        # One rendering per conversation where the template allows it (chat_spans.py); None: the prefix way for all.
        self.layouts = Layouts(self.chat.template) if one_render else None
        self.renders_saved = 0
        self.masks = block_ids_and_masks_by_lookup if starts_in_order(self.tok) else block_ids_and_masks
        # Masks from the ids where the tokenizer allows it (no offsets to compute); None: from the offsets.
        self.byte_starts = ByteStarts.of(self.tok, tokenizer_json) if by_bytes else None

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

    def _ids_and_masks(self, rendered: list) -> list:
        """Each rendering's ids and target mask (or its TurnError), the block encoded at once."""
        texts = [text for text, _ in rendered]
        spans = [spans for _, spans in rendered]
        if self.byte_starts is not None:
            return self.byte_starts.masks(self.tok, texts, spans, self.masks)
        return self.masks(self.tok.encode_batch(texts, add_special_tokens=False), texts, spans)

    def _encode(self, parsed: ParsedChatBlock, bad: list, rendered: list, kept: list) -> EncodedBlock:
        encoded = self._ids_and_masks(rendered)
        counts = dict.fromkeys(COUNTS, 0)
        out: dict[bool, dict[str, list]] = {v: {"tokens": [], "masks": [], "lengths": [], "keys": [], "lines": [],
                                                 "facts": []} for v in (False, True)}
        train_min = NO_DIGEST
        text_bytes = 0
        seq_len, drop_long = self.chat.seq_len, self.chat.on_long == "drop"
        ignored, ignored_kept = dict(parsed.ignored), []  # (line, keys dropped): most blocks have none
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
            if ignored and line in ignored:
                ignored_kept.append((line, ignored[line]))
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
        counts["ignored_keys"] = len(ignored_kept)
        return encoded_block(parsed, bad, text_bytes, train_min, out, counts, ignored_kept)


def encoded_block(parsed, bad: list, text_bytes: int, train_min, out: dict[bool, dict[str, list]],
                  counts: dict, ignored_keys: list | None = None) -> EncodedBlock:
    """A chat (or preference) block's result from its two sides (out[False]: train, out[True]: val), each a list per
    field of what its documents gave."""
    train, val = (_stack(out[v]) for v in (False, True))
    return EncodedBlock(
        n_lines=parsed.n_lines, blank=parsed.blank, bad=bad, text_bytes=text_bytes, special_inside=[],
        train_tokens=train["tokens"], train_lengths=train["lengths"], train_keys=train["keys"],
        val_tokens=val["tokens"], val_lengths=val["lengths"], val_keys=val["keys"], val_lines=val["lines"],
        train_min_digest=train_min, train_mask=train["masks"], val_mask=val["masks"], train_facts=train["facts"],
        val_facts=val["facts"], chat_counts=counts, ignored_keys=ignored_keys or [],
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
