"""The reply spans of a conversation from ONE rendering of it (prepare --format chat): the same spans as
chat.ChatTemplate.targets, which renders the conversation once more for each assistant turn's prefixes and stays
the definition, the proof and the fallback.

- The layout: in a ChatML rendering every turn starts with `<|im_start|>`. For a template whose turns follow the
  messages (not their text), the conversations of one shape (the role of each message, whether it has
  reasoning_content, whether its content is empty) start and end each assistant turn at the same `<|im_start|>` of
  their rendering (or at its end). Layouts learns that layout once per shape from a probe (a conversation of that
  shape whose texts are all "x") rendered the prefix way. A rendering with as many `<|im_start|>` as the layout's,
  each of its assistant turns starting with the header, then gives each target exactly as targets() cuts it
  (after the header, through the turn's last `<|im_end|>`).
- The proof, block by block: the first VERIFIED_PER_BLOCK conversations of a block that one rendering would take
  are rendered the prefix way too and its result kept; a difference (one rendering finding other spans, or spans
  where the prefix way refuses the conversation) marks the block `mismatch`, and ChatBlockEncoder renders the
  whole block again the prefix way. So a template that is not incremental, or whose turns follow the text, gives
  today's output wherever a block's sample shows it; the output of a block depends on its lines only (layouts
  are a pure function of the template and the shape), whatever worker ran it.
- Always the prefix way: a conversation whose text spells a special token (its `<|im_start|>` would count as a
  turn), a shape whose probe the prefix way refuses or whose turns do not end at an `<|im_start|>`, and a
  rendering whose `<|im_start|>` count or headers differ from its layout's. The time bound covers one
  conversation's renderings together, as in targets().
"""
from __future__ import annotations

from dataclasses import dataclass

from minilmd.corpus.chat import HEADER, IM_END, IM_START, ChatTemplate, TurnError, has_special_text

VERIFIED_PER_BLOCK = 8
"""Conversations of each block (the first that one rendering would take) rendered both ways, their prefix result
kept."""
MAX_SHAPES = 4096
"""Conversation shapes whose layout a worker keeps; the conversations of any other shape go the prefix way."""


@dataclass(frozen=True)
class Layout:
    """Of one conversation shape: how many `<|im_start|>` its rendering holds, and for each assistant turn the
    index of the `<|im_start|>` it starts at and of the one it ends at (None: the end of the rendering)."""
    n_starts: int
    turns: tuple[tuple[int, int | None], ...]


UNLEARNT = Layout(-1, ())
"""A shape whose layout could not be learnt: its conversations go the prefix way."""


def shape(messages: list[dict]) -> tuple:
    return tuple((m["role"], "reasoning_content" in m, not m["content"]) for m in messages)


def starts(text: str) -> list[int]:
    """The offsets of every `<|im_start|>` of text."""
    out, at = [], text.find(IM_START)
    while at >= 0:
        out.append(at)
        at = text.find(IM_START, at + len(IM_START))
    return out


def learn(full: str, turns: list[tuple[int, int]]) -> Layout:
    """The layout of a rendering whose assistant turns are `turns` (targets_and_turns), UNLEARNT when a turn does
    not start and end at an `<|im_start|>` (or the end)."""
    at = starts(full)
    index = {p: i for i, p in enumerate(at)}
    out = []
    for b, e in turns:
        if b not in index or (e != len(full) and e not in index):
            return UNLEARNT
        out.append((index[b], None if e == len(full) else index[e]))
    return Layout(len(at), tuple(out))


def spans_by_layout(full: str, layout: Layout) -> list[tuple[int, int]] | None:
    """The target spans of a rendering laid out as `layout`, None when it is not (then the prefix way decides)."""
    at = starts(full)
    if len(at) != layout.n_starts:
        return None
    spans = []
    for i, j in layout.turns:
        b, e = at[i], len(full) if j is None else at[j]
        if not full.startswith(HEADER, b, e):
            return None
        close = full.rfind(IM_END, b, e) - b
        if close < len(HEADER):
            return None
        spans.append((b + len(HEADER), b + close + len(IM_END)))
    return spans


class Layouts:
    """The layout of each conversation shape for one template, learnt once from a probe: a conversation of that
    shape whose every text is "x" (or empty), rendered the prefix way. A pure function of (template, shape), so
    that it may be kept across blocks; a probe the prefix way refuses, or beyond MAX_SHAPES, is UNLEARNT."""

    def __init__(self, template: ChatTemplate):
        self.template = template
        self.cache: dict[tuple, Layout] = {}

    def get(self, key: tuple) -> Layout:
        if key not in self.cache:
            if len(self.cache) >= MAX_SHAPES:
                return UNLEARNT
            self.cache[key] = self._probe(key)
        return self.cache[key]

    def _probe(self, key: tuple) -> Layout:
        probe = [{"role": role, "content": "" if empty else "x", **({"reasoning_content": "x"} if reasoning else {})}
                 for role, reasoning, empty in key]
        try:
            full, spans, turns = self.template.targets_and_turns(probe)
        except TurnError:
            return UNLEARNT
        layout = learn(full, turns)
        return layout if layout is not UNLEARNT and spans_by_layout(full, layout) == spans else UNLEARNT


class BlockSpans:
    """The spans of the conversations of one block, one rendering each where the template allows it."""

    def __init__(self, template: ChatTemplate, layouts: Layouts | None):
        self.template = template
        self.layouts = layouts  # None: every conversation the prefix way
        self.verified = 0
        self.mismatch = False
        self.renders_saved = 0  # conversations that took one rendering (for the tests and the bench)

    def targets(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """What template.targets(messages) returns (or raises)."""
        if self.layouts is None or self.mismatch or has_special_text(messages):
            return self.template.targets(messages)
        layout = self.layouts.get(shape(messages))
        if layout is UNLEARNT:
            return self.template.targets(messages)
        if self.verified < VERIFIED_PER_BLOCK:
            return self._verify(layout, messages)
        return self.template.bounded(self._once, layout, messages)

    def _once(self, layout: Layout, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        # whole(): the prefix way renders the whole first, the same refusal; called inside bounded() already.
        full = self.template.whole_within_bound(messages)
        spans = spans_by_layout(full, layout)
        if spans is None:
            return self.template.targets(messages)
        self.renders_saved += 1
        return full, spans

    def _verify(self, layout: Layout, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """The prefix way's result; `mismatch` when one rendering would have given another."""
        self.verified += 1
        try:
            full, spans, _ = self.template.targets_and_turns(messages)
        except TurnError as refused:
            if refused.reason != "template_limit":
                try:
                    found = spans_by_layout(self.template.whole(messages), layout)
                except TurnError:
                    found = None  # one rendering refuses it the same way (the prefix way renders the whole first)
                self.mismatch = found is not None
            raise
        if spans_by_layout(full, layout) not in (None, spans):
            self.mismatch = True
        return full, spans
