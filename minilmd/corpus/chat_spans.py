"""The reply spans of a conversation from ONE rendering of it (prepare --format chat): the same spans as
chat.ChatTemplate.targets, which renders the conversation once more for each assistant turn's prefixes and stays
the definition, the proof and the fallback.

- The layout: in a ChatML rendering every turn starts with `<|im_start|>`. For a template whose turns follow the
  messages (not their text), the conversations of one shape (the role of each message, whether it has
  reasoning_content, whether its content is empty) start and end each assistant turn at the same `<|im_start|>` of
  their rendering (or at its end). Layouts learns that layout once per shape from a probe (a conversation of that
  shape with short texts). A shape of at most PROBED_TURNS assistant turns: the probe rendered the prefix way,
  every turn (texts "x"). A longer one never renders every prefix: when the short shapes learnt so far showed one
  message at each `<|im_start|>` (after as many as a shape with its first entry had before it) and held each pair
  of neighbouring entries it holds (its last entry at the end too), that layout, without rendering; else, in time
  linear in its length, the probe (message i's text `x{i}x`, its thought `r{i}r`) rendered once, each message
  placed at the last `<|im_start|>` before its text (in order, each at its own; a run of messages with no text to
  find only where as many `<|im_start|>` are left for it), and the layout so read checked the prefix way at three
  of its assistant turns (the first, one in the middle, the last). The prediction depends on the short shapes a
  worker met first; for a template laid out one message per `<|im_start|>` it is what the prefix way learns.
  A rendering with as many `<|im_start|>` as the layout's, each of its assistant turns starting with the header,
  then gives each target exactly as targets() cuts it (after the header, through the turn's last `<|im_end|>`).
- The proof, block by block: the first VERIFIED_PER_BLOCK conversations of a block that one rendering would take
  and that hold at most PROVED_MESSAGES messages are rendered the prefix way too and its result kept; a difference
  (one rendering finding other spans, or spans where the prefix way refuses the conversation) marks the block
  `mismatch`, and ChatBlockEncoder renders the whole block again the prefix way. So a template that is not
  incremental, or whose turns follow the text, gives today's output wherever a block's sample shows it, and the
  proof costs a bounded time per block whatever the length of its conversations. The output of a block depends on
  its lines only, whatever worker ran it, for every template laid out one message per `<|im_start|>` (a long
  shape's prediction is then its probe's layout) and otherwise wherever the proof holds.
- Always the prefix way: a conversation whose text spells a special token (its `<|im_start|>` would count as a
  turn), one with tools, tool calls or tool results (MiniMind's template merges tool results into one turn and
  writes the specs into the system turn: not a layout its shape's probe shows), a shape whose probe the prefix
  way refuses or whose turns do not end at an `<|im_start|>`, and a rendering whose `<|im_start|>` count or
  headers differ from its layout's. The bound (CPU time, scaled to the
  messages rendered: chat_sandbox.py) covers one conversation's renderings together, as in targets().
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import pairwise

from minilmd.corpus.chat import HEADER, IM_END, IM_START, ChatTemplate, TurnError, has_special_text
from minilmd.corpus.chat_tools import uses_tools

VERIFIED_PER_BLOCK = 8
"""Conversations of each block (the first that one rendering would take) rendered both ways, their prefix result
kept."""
PROVED_MESSAGES = 16
"""The longest conversation (in messages) a block's proof renders the prefix way: the proof's time is bounded."""
PROBED_TURNS = 8
"""A shape of at most this many assistant turns learns its layout from the prefix renderings of every turn; a
longer one from the short shapes or one rendering (module docstring)."""
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


def place(full: str, at: list[int], probe: list[dict]) -> list[int] | None:
    """The index in `at` (the `<|im_start|>` of the probe's rendering `full`) where each message of the probe starts,
    None where the rendering is not laid out one message after the other, each at its own `<|im_start|>`. A
    message whose text is found starts at the last `<|im_start|>` before it (and after the text before it); a run
    of messages without text to find (empty) takes the `<|im_start|>` between its neighbours only when there are
    exactly as many as it has messages (a run first or last: those next to its one neighbour)."""
    found = _found(full, at, probe)
    return None if found is None else _fill(found, len(at))


def _found(full: str, at: list[int], probe: list[dict]) -> list[int | None] | None:
    """The `<|im_start|>` index of each message whose text is found in order (None: no text to find)."""
    found: list[int | None] = []
    cursor = 0
    for m in probe:
        text = m["content"] or m.get("reasoning_content") or ""
        where = full.find(text, cursor) if text else -1
        if where < 0:
            found.append(None)
            continue
        i = bisect_right(at, where) - 1
        if i < 0 or at[i] < cursor:
            return None
        found.append(i)
        cursor = where + len(text)
    return found


def _fill(found: list[int | None], n_starts: int) -> list[int] | None:
    """Every message's index: the runs of None given the indexes between their neighbours (place)."""
    out: list[int] = []
    for k, i in enumerate(found):
        if i is None:
            continue
        run = k - len(out)  # the messages before k without an index yet
        if (out and i - out[-1] - 1 != run) or i < run:  # each message of the run at its own `<|im_start|>`
            return None
        out.extend(range(i - run, i + 1))
    tail = len(found) - len(out)
    if tail:
        if not out or n_starts - 1 - out[-1] != tail:
            return None
        out.extend(range(out[-1] + 1, n_starts))
    return out


END = ("end",)
"""The entry after a conversation's last message, in Layouts.pairs."""


def per_message(before: int, n: int, replies: list[int]) -> Layout:
    """The layout of a rendering of n messages, one at each `<|im_start|>` after the first `before` ones."""
    return Layout(before + n, tuple((before + i, before + i + 1 if i + 1 < n else None) for i in replies))


class Layouts:
    """The layout of each conversation shape for one template, learnt once from a probe (module docstring): a
    conversation of that shape with short texts (or empty ones). Kept across blocks; a probe the prefix way
    refuses, or beyond MAX_SHAPES, is UNLEARNT."""

    def __init__(self, template: ChatTemplate):
        self.template = template
        self.cache: dict[tuple, Layout] = {}
        self.prelude: dict[tuple, int | None] = {}  # first message's entry -> the `<|im_start|>` before it
        self.pairs: set[tuple] = set()  # neighbouring entries (the last one beside END) proven one per message

    def get(self, key: tuple) -> Layout:
        if key not in self.cache:
            if len(self.cache) >= MAX_SHAPES:
                return UNLEARNT
            self.cache[key] = self._probe(key)
        return self.cache[key]

    def _probe(self, key: tuple) -> Layout:
        replies = [i for i, (role, _, _) in enumerate(key) if role == "assistant"]
        if len(replies) > PROBED_TURNS:
            predicted = self._predicted(key, replies)
            if predicted is not None:
                return predicted
            try:
                return self.template.bounded(self._read, key, replies)
            except TurnError:  # beyond the bound: the prefix way decides
                return UNLEARNT
        probe = [{"role": role, "content": "" if empty else "x", **({"reasoning_content": "x"} if reasoning else {})}
                 for role, reasoning, empty in key]
        try:
            full, spans, turns = self.template.targets_and_turns(probe)
        except TurnError:
            return UNLEARNT
        layout = learn(full, turns)
        if layout is UNLEARNT or spans_by_layout(full, layout) != spans:
            return UNLEARNT
        self._note(key, replies, layout)
        return layout

    def _note(self, key: tuple, replies: list[int], layout: Layout) -> None:
        """What a short shape's layout, learnt the prefix way, proves for long ones: where the `<|im_start|>` of
        its first message is, and that its neighbouring entries render one message at each `<|im_start|>`."""
        before = layout.n_starts - len(key)
        if before < 0 or layout != per_message(before, len(key), replies):
            return
        known = self.prelude.setdefault(key[0], before)
        if known != before:
            self.prelude[key[0]] = None  # shapes that disagree: no prediction from this first entry
            return
        self.pairs.update(pairwise(key))
        self.pairs.add((key[-1], END))

    def _predicted(self, key: tuple, replies: list[int]) -> Layout | None:
        """A long shape's layout without rendering: one message at each `<|im_start|>` after the prelude its first
        entry showed in short shapes, when every pair of neighbouring entries it holds was proven in them."""
        before = self.prelude.get(key[0])
        if before is None or (key[-1], END) not in self.pairs or not all(p in self.pairs for p in pairwise(key)):
            return None
        return per_message(before, len(key), replies)

    def _read(self, key: tuple, replies: list[int]) -> Layout:
        """The layout of a long shape from one rendering of its probe, checked the prefix way at three of
        its turns (module docstring); called inside bounded()."""
        probe = [{"role": role, "content": "" if empty else f"x{i}x",
                  **({"reasoning_content": f"r{i}r"} if reasoning else {})}
                 for i, (role, reasoning, empty) in enumerate(key)]
        try:
            full = self.template.whole_within_bound(probe)
        except TurnError:
            return UNLEARNT
        at = starts(full)
        first = place(full, at, probe)
        if first is None:
            return UNLEARNT
        layout = Layout(len(at), tuple((first[k], first[k + 1] if k + 1 < len(probe) else None) for k in replies))
        spans = spans_by_layout(full, layout)
        if spans is None:
            return UNLEARNT
        checked = sorted({0, len(replies) // 2, len(replies) - 1})
        try:
            again, want, turns = self.template.turns_within_bound(probe, frozenset(replies[j] for j in checked))
        except TurnError:
            return UNLEARNT
        ends = [(at[b], len(full) if e is None else at[e]) for b, e in layout.turns]
        if again != full or want != [spans[j] for j in checked] or turns != [ends[j] for j in checked]:
            return UNLEARNT
        return layout


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
        if self.layouts is None or self.mismatch or has_special_text(messages) or uses_tools(messages):
            return self.template.targets(messages)  # a tool turn's layout is not its shape's: the prefix way
        layout = self.layouts.get(shape(messages))
        if layout is UNLEARNT:
            return self.template.targets(messages)
        if self.verified < VERIFIED_PER_BLOCK and len(messages) <= PROVED_MESSAGES:
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
