"""Chat data for `minilmd prepare --format chat`, `minilmd sample --chat` and `minilmd chat`: MiniMind's SFT
conversations checked line by line, rendered by the tokenizer's own chat template exactly as transformers'
`apply_chat_template` renders them, and the character spans of the assistant replies that are the targets.

- Input lines: `{"conversations": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]}` (or
  `"messages"`, the OpenAI style's name for the list: raw_corpus.CHAT_KEYS), with
  MiniMind's tool-call schema (`tools` on a system message, `tool_calls` on an assistant one, `role: "tool"`
  results: chat_tools.py); a null value is an absent key, and so is an empty string in a tool key
  (chat_tools.without_absent); a null or absent content is "". A line is bad (reason and detail, as jsonl.parse_block
  names them) when it is not valid UTF-8 or JSON, not an object with a "conversations" list, the list is empty, a
  message is not an object, has a role outside the four, a content that is not a string (or holds a lone surrogate;
  null on a first message that is a system one), a key other than role, content, reasoning_content (a string), tools
  and tool_calls, a tool field MiniMind could not render, an assistant message with a null or absent content and no
  tool_calls (`empty_reply`: it would teach empty answers), or when no message is the assistant's. Other keys of the
  line (an "id") are ignored; what MiniMind's template never renders (OpenAI's `tool_call_id` and `name`, a tool
  key off its role) is dropped from the message and named (chat_tools.py). A preference pair's sides (--format
  dpo) keep the three roles and keys, `tool_call_id` and `name` dropped and named alike.
- The template: `chat_template.jinja` in the tokenizer's directory when there is one (transformers prefers it),
  else `chat_template` of its `tokenizer_config.json` (a string, or a list of named templates: "default"). It runs
  in the environment transformers' `_compile_jinja_template` builds: jinja2's ImmutableSandboxedEnvironment with
  trim_blocks and lstrip_blocks, the loopcontrols extension, a `{% generation %}` block that renders its body,
  the filter `tojson` and the globals `raise_exception`, `strftime_now`, `dict` and `namespace` as transformers
  defines them; it sees `messages`, `tools` (the conversation's: its last system message's, as MiniMind passes
  them, the same for every prefix rendered; None without), `documents` (None), `add_generation_prompt` and the
  special token names of tokenizer_config.json (`bos_token`, `eos_token`, ...). A message with `reasoning_content`
  also carries it as `thinking`, as transformers passes it. The template is untrusted code: its renderings are
  bounded in CPU time (scaled to the messages rendered) and size (chat_sandbox.py); a conversation that goes
  beyond is a bad line, `template_limit`.
- Targets: the template is rendered for the whole conversation and for its prefixes up to each assistant message.
  Assistant turn k is the text between the rendering of messages[:k] and that of messages[:k + 1]; each must be a
  prefix of the whole rendering (a template that renders a turn differently depending on what follows it cannot
  say which text is the reply: such a conversation is a bad line, `template_not_incremental`). Within the turn the
  target starts after the `<|im_start|>assistant\\n` header and ends after the turn's last `<|im_end|>` (the "\\n"
  the template writes after it is not a target). A token is a target when its first character is inside a target
  span; `ChatEncoder` in chat_encode.py turns the spans into the loss mask. This rule is the definition: prepare
  finds the same spans from one rendering where the template allows it (chat_spans.py), checked against it.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from minilmd.corpus.chat_budget import Exceeded, TemplateLimits, limited
from minilmd.corpus.chat_sandbox import compile_template
from minilmd.corpus.chat_tools import (
    TOOL_KEYS,
    check_tool_keys,
    conversation_tools,
    schema_keys,
    tool_text,
    without_absent,
)
from minilmd.corpus.sources.jsonl import json_lines, loads_bounded
from minilmd.corpus.sources.line_shape import other_format
from minilmd.protocol import SPECIAL_TOKENS
from minilmd.raw_corpus import CHAT_KEYS

TEXT_KEYS = ("role", "content", "reasoning_content")
PLAIN_ROLES = ("system", "user", "assistant")
"""A preference pair's roles and keys (--format dpo: MiniMind's DPODataset passes its template no tools)."""
ROLES = (*PLAIN_ROLES, "tool")
MESSAGE_KEYS = (*TEXT_KEYS, *TOOL_KEYS)
_ALLOWED = {True: (ROLES, MESSAGE_KEYS, frozenset(MESSAGE_KEYS)), False: (PLAIN_ROLES, TEXT_KEYS, frozenset(TEXT_KEYS))}
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
HEADER = f"{IM_START}assistant\n"
"""What opens an assistant turn; the target starts after it."""


class ChatError(ValueError):
    """A tokenizer without a usable chat template, or a conversation the template cannot render."""


class TemplateLimitError(ChatError):
    """A rendering went beyond the template's TemplateLimits (time or size: chat_sandbox.py)."""


class TurnError(ChatError):
    """One conversation the template renders in a way targets cannot be found in: (reason, detail) of a bad line."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


# --- conversations ---------------------------------------------------------------------------------------------
SHAREGPT_KEYS = frozenset({"from", "value"})
SHAREGPT_HOW = ('convert each message to {"role": ..., "content": value}, "from" human -> "user", gpt -> '
                '"assistant", system -> "system"')
ALPACA_KEYS = ("instruction", "output")
ALPACA_HOW = ('convert each line to {"conversations": [{"role": "user", "content": instruction (+ "\\n" + input)}, '
              '{"role": "assistant", "content": output}]}')
"""Two other chat shapes a user may have (ShareGPT's messages, Alpaca's lines): a line of either is refused naming
its shape and the conversion, not as a line missing "conversations" alone."""


def check_conversation(obj, tools: bool = True, ignored: list[str] | None = None
                       ) -> tuple[list[dict] | None, tuple[str, str] | None]:
    """(messages, None) for a good line's JSON value, (None, (reason, detail)) for a bad one (module docstring).
    The messages hold only the keys of MESSAGE_KEYS, a tool field parsed (chat_tools.py); `tools` False: the three
    roles and keys of TEXT_KEYS alone (a preference pair's sides). The keys MiniMind trains on but its template
    never renders are dropped, each named in `ignored` (`message 2 (role 'tool') "tool_call_id"`)."""
    ignored = [] if ignored is None else ignored
    key = next((k for k in CHAT_KEYS if k in obj), None) if isinstance(obj, dict) else None
    if key is None:
        other = other_format(obj, "chat")  # a text line, a preference pair: --format text, dpo
        if other:
            return None, other
        if isinstance(obj, dict) and all(k in obj for k in ALPACA_KEYS):
            return None, ("missing_conversations", f"line is Alpaca-style ({'/'.join(map(repr, ALPACA_KEYS))}): "
                                                   f"{ALPACA_HOW}")
        what = ('an object without "conversations" or "messages"' if isinstance(obj, dict)
                else f"a JSON {type(obj).__name__}")
        return None, ("missing_conversations", f"line is {what}")
    conv = obj[key]
    if not isinstance(conv, list):
        return None, ("conversations_not_list", f'"{key}" is a JSON {type(conv).__name__}')
    if not conv:
        return None, ("empty_conversation", f'"{key}" is an empty list')
    roles, keys, allowed = _ALLOWED[tools]
    messages = []
    for i, m in enumerate(conv):
        if not isinstance(m, dict):
            return None, ("message_not_object", f"message {i} is a JSON {type(m).__name__}")
        if "role" not in m and SHAREGPT_KEYS <= m.keys():
            return None, ("unknown_message_key", f"message {i} is ShareGPT-style ('from'/'value'): {SHAREGPT_HOW}")
        m = without_absent(m)  # null, and "" in a tool key: an absent key (HF datasets writes every key of its schema)
        if not m.keys() <= allowed or tools and ("tools" in m or "tool_calls" in m):  # the first test: most lines
            m, bad = schema_keys(i, m, allowed, keys, ignored)
            if bad:
                return None, bad
        role = m.get("role")
        if role not in roles:
            return None, ("unknown_role", f"message {i} has role {role!r} (allowed: {', '.join(roles)})")
        null_content = m.get("content") is None
        if null_content:  # null or absent: MiniMind's template renders "" (`content is string`) ...
            if i == 0 and role == "system":  # ... but adds a first system message's to a string, and fails
                return None, ("content_not_string", 'message 0 "content" is null on the first message, a system one: '
                                                    "MiniMind's template adds it to a string and fails")
            m = {**m, "content": ""}
        for key in ("content", "reasoning_content") if "reasoning_content" in m else ("content",):
            value = m.get(key)
            if not isinstance(value, str):
                return None, ("content_not_string", f'message {i} "{key}" is a JSON {type(value).__name__}')
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                return None, ("invalid_utf8", f'message {i} "{key}": lone surrogate {value[e.start]!r}')
        kept = {k: m[k] for k in TEXT_KEYS if k in m}
        bad = check_tool_keys(i, m, kept)
        if bad:
            return None, bad
        if null_content and role == "assistant" and "tool_calls" not in kept:  # a reply that says nothing
            return None, ("empty_reply", f'message {i} is the assistant\'s with a null "content" and no "tool_calls": '
                                         "it would train the model to answer with an empty reply")
        messages.append(kept)
    if not any(m["role"] == "assistant" for m in messages):
        return None, ("no_assistant_turn", f"{len(messages)} messages, none with role 'assistant'")
    return messages, None


_CANONICAL = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))
"""json.dumps with these options, made once (json.dumps makes an encoder at every call given options)."""


def canonical(messages: list[dict]) -> str:
    """The text the split rule and the leak key are computed on: the messages as compact JSON, keys sorted."""
    return _CANONICAL.encode(messages)


SPECIAL_MARK = "<|"
"""What every special token's text holds: a text without it spells none (one search instead of one per token)."""
assert all(SPECIAL_MARK in t for t in SPECIAL_TOKENS)


def has_special_text(messages: list[dict]) -> bool:
    """Whether a message's text spells a special token (it then encodes to id 0, 1 or 2 inside the turn)."""
    for m in messages:
        for text in (m.get("content"), m.get("reasoning_content"), tool_text(m)):
            if text and SPECIAL_MARK in text and any(t in text for t in SPECIAL_TOKENS):
                return True
    return False


def starts_as_chat(path: str, probe_bytes: int = 1 << 16) -> bool:
    """Whether a JSONL file's first line that is a JSON object (within its first probe_bytes) is a conversation
    ({"conversations": [...]} or {"messages": [...]} without "text") or a preference pair ({"chosen": ...,
    "rejected": ...}), as line_shape.py tells them: what `corpus report` refuses to count as text for a run's
    budget."""
    from minilmd.corpus.sources.jsonl import LongLine, Source

    src = Source(path)
    try:
        for item in src.items(probe_bytes):
            if isinstance(item, LongLine):
                return False
            for line in item[1].splitlines():
                try:
                    obj = loads_bounded(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):  # a chat line or a pair, told as every reader tells them
                    return "text" not in obj and other_format(obj, "text") is not None
            return False
        return False
    finally:
        src.close()


@dataclass
class ParsedChatBlock:
    conversations: list[list[dict]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    bad: list[tuple[int, str, str]] = field(default_factory=list)
    ignored: list[tuple[int, str]] = field(default_factory=list)
    blank: int = 0
    n_lines: int = 0


def checked_lines(blob: bytes, first_line: int, out,
                  check: Callable[[Any], tuple[Any, Any]]) -> Iterator[tuple[int, Any]]:
    """(line number, item) of each line of whole lines of JSONL that `check` accepts (it returns (item, None) or
    (None, (reason, detail))); the others go to out.bad with their reasons, blank lines to out's counts. Shared by
    chat (parse_chat_block) and DPO (prepare/dpo_encode.parse_pair_block) corpora."""
    for lineno, obj, bad in json_lines(blob, first_line, out):
        if bad is None:
            item, bad = check(obj)
            if item is not None:
                yield lineno, item
                continue
        assert bad is not None  # a line is an item or bad
        out.bad.append((lineno, *bad))


def parse_chat_block(blob: bytes, first_line: int) -> ParsedChatBlock:
    """Whole lines of chat JSONL -> the conversations, the bad lines with their reasons, and (line, keys dropped)
    of the conversations kept without keys their template never renders (check_conversation's `ignored`)."""
    out = ParsedChatBlock()
    notes: list[str] = []  # each line's, cleared before it is checked

    def check(obj):
        notes.clear()
        return check_conversation(obj, ignored=notes)

    for lineno, messages in checked_lines(blob, first_line, out, check):
        out.conversations.append(messages)
        out.lines.append(lineno)
        if notes:
            out.ignored.append((lineno, "; ".join(notes)))
    return out


# --- the template --------------------------------------------------------------------------------------------
def _compile(source: str, limits: TemplateLimits):
    """The template in transformers' environment (module docstring), bounded (chat_sandbox.py)."""
    try:
        return compile_template(source, limits)
    except ValueError as e:
        raise ChatError(str(e)) from None


def special_token_names(config: dict) -> dict[str, str]:
    """The `*_token` entries of a tokenizer_config.json (a string, or an AddedToken's "content"), as transformers
    passes its special_tokens_map to the template."""
    out = {}
    for key, value in config.items():
        if not key.endswith("_token"):
            continue
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


@dataclass
class ChatTemplate:
    """A tokenizer's chat template, compiled: `render` as apply_chat_template(tokenize=False), `turns` for the
    targets. Picklable (the compiled template is rebuilt in each worker)."""

    source: str
    special_tokens: dict[str, str]
    limits: TemplateLimits = field(default_factory=TemplateLimits)

    def __post_init__(self):
        self._template, self._budget = _compile(self.source, self.limits)

    def __getstate__(self):
        return {"source": self.source, "special_tokens": self.special_tokens, "limits": self.limits}

    def __setstate__(self, state):
        self.source, self.special_tokens, self.limits = state["source"], state["special_tokens"], state["limits"]
        self._template, self._budget = _compile(self.source, self.limits)

    @classmethod
    def from_config(cls, config: dict, limits: TemplateLimits | None = None) -> ChatTemplate:
        return cls(config["chat_template"], special_token_names(config), limits or TemplateLimits())

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The text apply_chat_template(messages, tokenize=False, add_generation_prompt=...) produces.
        TemplateLimitError when the rendering goes beyond self.limits."""
        try:
            with limited(self._budget):
                return self._render(messages, add_generation_prompt)
        except Exceeded as e:
            raise TemplateLimitError(f"the chat template went beyond its bound: {e}") from None

    def _render(self, messages: list[dict], add_generation_prompt: bool = False,
                conversation: list[dict] | None = None) -> str:
        """`conversation`: the whole one whose prefix `messages` is (its tools are every prefix's)."""
        self._budget.allow(len(messages))  # the bound grows with what is rendered (chat_sandbox.TemplateLimits)
        chat = [{"thinking": m["reasoning_content"], **m} if "reasoning_content" in m else dict(m)
                for m in messages]
        tools = conversation_tools(messages if conversation is None else conversation)
        return self._template.render(messages=chat, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt, **self.special_tokens)

    def targets(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """(the whole rendering, the [start, end) character span of each assistant reply's target). TurnError
        (reason, detail) when the template fails or its text does not show where a reply is (module docstring);
        `template_limit` when its renderings together go beyond self.limits."""
        full, spans, _ = self.targets_and_turns(messages)
        return full, spans

    def targets_and_turns(self, messages: list[dict], only: frozenset[int] | None = None
                          ) -> tuple[str, list[tuple[int, int]], list[tuple[int, int]]]:
        """targets() and the [start, end) of each assistant message's whole turn in the rendering (the lengths of
        the renderings before and through it): what chat_spans.py learns a conversation shape's layout from.
        `only`: the spans and turns of those assistant messages (their indexes in messages) alone, with the same
        checks, the prefixes of the others not rendered."""
        return self.bounded(self._targets, messages, only)

    def bounded(self, fn, *args):
        """fn(*args), the renderings it makes bounded together by self.limits (re-entrant: inside another call's
        bound, that one's); beyond them, TurnError `template_limit`. The except encloses the bound's clean-up, where
        a late alarm may land."""
        try:
            with limited(self._budget):
                return fn(*args)
        except Exceeded as e:
            raise TurnError("template_limit", str(e)) from None

    def whole(self, messages: list[dict]) -> str:
        """The rendering of the whole conversation, as targets() renders it first (TurnError as it raises)."""
        return self.bounded(self._render_or_bad, messages)

    def whole_within_bound(self, messages: list[dict]) -> str:
        """whole() for a caller already inside bounded(), whose bound covers it (one bound set up, not two)."""
        return self._render_or_bad(messages)

    def turns_within_bound(self, messages: list[dict], only: frozenset[int]
                           ) -> tuple[str, list[tuple[int, int]], list[tuple[int, int]]]:
        """targets_and_turns(messages, only) for a caller already inside bounded()."""
        return self._targets(messages, only)

    def _targets(self, messages: list[dict], only: frozenset[int] | None = None
                 ) -> tuple[str, list[tuple[int, int]], list[tuple[int, int]]]:
        cache: dict[int, str] = {}

        def upto(k: int) -> str:  # the rendering of messages[:k]; only the last two are kept (memory)
            if k not in cache:
                if k == 0:
                    try:
                        cache[0] = self._render([], conversation=messages)
                    except Exception:  # noqa: BLE001 - many templates cannot render no messages: nothing before
                        cache[0] = ""
                else:
                    cache[k] = self._render_or_bad(messages[:k], messages)
                for old in [j for j in cache if j < k - 1]:
                    del cache[old]
            return cache[k]

        full = upto(len(messages))
        spans, turns = [], []
        for k, m in enumerate(messages):
            if m["role"] != "assistant" or (only is not None and k not in only):
                continue
            before, through = upto(k), upto(k + 1)
            if not (full.startswith(before) and full.startswith(through) and len(through) >= len(before)):
                raise TurnError("template_not_incremental",
                                f"the template renders the messages before assistant message {k} differently in the "
                                "whole conversation, so the reply's text cannot be told apart")
            turn = full[len(before):len(through)]
            if not turn.startswith(HEADER):
                raise TurnError("template_output", f"assistant message {k} renders as {turn[:40]!r}..., not "
                                                   f"starting with the header {HEADER!r}")
            close = turn.rfind(IM_END)
            if close < len(HEADER):
                raise TurnError("template_output", f"assistant message {k} renders without a closing {IM_END!r}")
            spans.append((len(before) + len(HEADER), len(before) + close + len(IM_END)))
            turns.append((len(before), len(through)))
        return full, spans, turns

    def _render_or_bad(self, messages: list[dict], conversation: list[dict] | None = None) -> str:
        try:
            return self._render(messages, conversation=conversation)
        except Exception as e:  # noqa: BLE001 - the template is untrusted code: any failure refuses the conversation
            raise TurnError("template_error", f"{type(e).__name__}: {e}") from None
