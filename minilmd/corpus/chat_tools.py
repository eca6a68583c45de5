"""MiniMind's tool-call schema in chat conversations (chat.check_conversation), as MiniMind's SFTDataset reads it
(dataset/lm_dataset.py: `create_chat_prompt`) and its tokenizer's chat template renders it.

- `tools` on a system message: the function specs the conversation may call, a list of objects or that list as a
  JSON string (MiniMind's files hold the string). MiniMind passes the last system message's `tools` to
  `apply_chat_template(..., tools=...)`; its template writes them into the system turn. A string spelling an empty
  value (`"null"`, `"[]"`, `"{}"`) MiniMind parses, and it replaces the `tools` of an earlier system message: no
  tools are rendered (kept here as `[]`, a list given as such read as its JSON string).
- `tool_calls` on an assistant message: a list of calls, or that list as a JSON string, each an object (or an
  OpenAI-style `{"function": {...}}` wrapping one) with its `arguments` (an object or any JSON value, a string
  written as is) and its `name`, written as the template writes it: a call without one renders with an empty
  name, as MiniMind's template renders it. A string spelling an empty value (`"null"`, `"[]"`, `"{}"`) renders
  no call, as if the key were absent (it is dropped).
- `role: "tool"`: a tool's result, its `content` a string; MiniMind's template writes it into a user turn
  (`<tool_response>`), so it is never a target.
- Absent keys (without_absent, the one rule): a null value is an absent key (HF `datasets` writes every key of
  its schema, null where a message has none), and so is an empty string in `tools` or `tool_calls` (MiniMind
  parses only a truthy one and its template renders only a truthy one; `reasoning_content: ""` is not absent: its
  template then reads no reasoning out of the content). A null or absent `content` is "" (chat.check_conversation)
  as MiniMind's template renders it (`content is string`), but on a first message that is a system one, which the
  template adds to a string: its rendering fails, the line is bad.
  A JSON string is parsed here, once, so that every rendering and the corpus's canonical text see the parsed value.
- What MiniMind trains on but its template never renders is dropped from the message, the line kept and counted
  (chat.check_conversation's `ignored`, named by line and key): `tools` on a message other than a system one
  (MiniMind reads them from a system message only), `tool_calls` on one other than an assistant's (only an
  assistant's are rendered; a string that is not JSON is still a bad line, as MiniMind's `json.loads` fails on
  it), and OpenAI's `tool_call_id` and `name` on a message (IGNORED_KEYS), a preference pair's sides too (MiniMind's
  DPODataset hands its template every key; the pair's line kept, counted as a chat line is).
A value MiniMind could not render (a spec that is not an object, a call without `arguments`) makes the line bad,
`bad_tools` or `bad_tool_calls`, the detail naming the message; a lone surrogate anywhere in them (a JSON escape),
`invalid_utf8`, as in a content. A JSON string of another falsy value (`"0"`, `"false"`, `"\"\""`), which MiniMind's
`if` would skip too, stays `not a list`: no corpus means it, and a typo is better named.
"""
from __future__ import annotations

import json
from typing import Any

from minilmd.corpus.sources.jsonl import loads_bounded

TOOL_KEYS = ("tools", "tool_calls")
"""The message keys of the tool-call schema (chat.MESSAGE_KEYS holds them too)."""
IGNORED_KEYS = ("tool_call_id", "name")
"""OpenAI's message keys a tool-call corpus often holds: no template of MiniMind's reads them, so they are dropped
(and counted) rather than refused."""
_DROPPED = frozenset(IGNORED_KEYS)
ROLE_OF = {"tools": "system", "tool_calls": "assistant"}
"""The role whose message MiniMind's template renders a tool key of: on another, the key is dropped."""
_KEPT_NULL = ("role", "content")
"""Keys a null value of which check_conversation judges itself (an unknown role; a content rendered as "")."""
_EMPTY: tuple[None, list, dict] = (None, [], {})
"""What a tool key's JSON string may spell that renders nothing (MiniMind's `if`): no tools, no calls."""


def without_absent(m: dict) -> dict:
    """Message m without its absent keys (module docstring): a null value, an empty string of a tool key; a null
    role or content stays, for check_conversation to judge. m itself when none is absent (most messages)."""
    if None not in m.values() and m.get("tools") != "" and m.get("tool_calls") != "":
        return m
    return {k: v for k, v in m.items()
            if k in _KEPT_NULL or not (v is None or v == "" and k in TOOL_KEYS)}


def _parsed_list(value: Any) -> tuple[list | None, str]:
    """(the list `value` is or spells as JSON, [] for an empty value, _EMPTY's, "") or (None, what it is instead)."""
    if isinstance(value, str):
        try:  # the line it came in was bounded; the string inside it is bounded the same way (size, depth)
            value = loads_bounded(value)
        except ValueError as e:
            return None, f"a string that is not JSON ({e})"
    if value in _EMPTY:
        return [], ""
    if not isinstance(value, list):
        return None, f"a JSON {type(value).__name__}, not a list"
    return value, ""


def _call_problem(call: Any) -> str:
    """Why one entry of tool_calls cannot be rendered as MiniMind renders it ("" when it can)."""
    if not isinstance(call, dict):
        return f"a JSON {type(call).__name__}, not an object"
    inner = call.get("function") or call  # the template's `{% if tool_call.function %}`: a falsy one is no wrapper
    if not isinstance(inner, dict):
        return f'"function" is a JSON {type(inner).__name__}, not an object'
    if "arguments" not in inner:  # any JSON value is written (a string as is, else `tojson`); none, its error
        return 'no "arguments"'
    return ""  # a missing "name" the template writes as "" (jinja2's undefined), as MiniMind's does


def schema_keys(i: int, m: dict, allowed: frozenset, keys: tuple, ignored: list[str]
                ) -> tuple[dict, tuple[str, str] | None]:
    """(message i, its absent keys gone (without_absent), without the keys MiniMind's template never renders,
    IGNORED_KEYS and a tool key off its role (ROLE_OF), each named in `ignored`, None); or (m, (reason, detail)) of a
    bad line: a key outside `allowed` and IGNORED_KEYS, or `tool_calls` MiniMind's `json.loads` fails on (it
    parses them on any message). The message given is left as it came."""
    extra = m.keys() - allowed
    unknown = extra - _DROPPED
    if unknown:
        return m, ("unknown_message_key", f"message {i} has {', '.join(map(repr, sorted(unknown)))} (allowed: "
                                          f"{', '.join(keys)})")
    if extra:
        ignored.extend(f'message {i} (role {m.get("role")!r}) "{k}"' for k in IGNORED_KEYS if k in m)
        m = {k: v for k, v in m.items() if k not in extra}
    for key, role in ROLE_OF.items():
        if key in m and m.get("role") != role:
            value = m[key]
            if key == "tool_calls" and isinstance(value, str):
                try:
                    loads_bounded(value)
                except ValueError as e:
                    return m, ("bad_tool_calls", f'message {i} "tool_calls" is a string that is not JSON ({e})')
            m = {k: v for k, v in m.items() if k != key}
            ignored.append(f'message {i} (role {m.get("role")!r}) "{key}"')
    return m, None


def check_tool_keys(i: int, m: dict, out: dict) -> tuple[str, str] | None:
    """Check message i's `tools` and `tool_calls` (absent ones and those off their role already dropped:
    schema_keys) and put their parsed values into `out`, the message as chat.check_conversation keeps it: `tools`
    spelling an empty value as [] (it still replaces earlier ones: conversation_tools), such `tool_calls` not at
    all; (reason, detail) of a bad line when one is not MiniMind's."""
    if "tools" in m:
        tools, what = _parsed_list(m["tools"])
        if tools is None:
            return "bad_tools", f'message {i} "tools" is {what}'
        for k, spec in enumerate(tools):
            if not isinstance(spec, dict):
                return "bad_tools", f'message {i} "tools" entry {k} is a JSON {type(spec).__name__}, not an object'
        out["tools"] = tools
    if "tool_calls" in m:
        calls, what = _parsed_list(m["tool_calls"])
        if calls is None:
            return "bad_tool_calls", f'message {i} "tool_calls" is {what}'
        for k, call in enumerate(calls):
            problem = _call_problem(call)
            if problem:
                return "bad_tool_calls", f'message {i} "tool_calls" entry {k}: {problem}'
        if calls:
            out["tool_calls"] = calls
    try:  # a JSON escape can spell a lone surrogate anywhere in a spec: the corpus's canonical text could not hold it
        tool_text(out).encode("utf-8")
    except UnicodeEncodeError as e:
        return "invalid_utf8", f"message {i} tools or tool_calls: lone surrogate {e.object[e.start]!r}"
    return None


def conversation_tools(messages: list[dict]) -> list | None:
    """The `tools` the template is given for a conversation: the last system message's, as MiniMind takes them, an
    empty one ([]: a JSON string spelling null, [] or {}) replacing earlier ones as MiniMind's `tools =
    json.loads(...)` does (None: the conversation has none)."""
    tools = None
    for m in messages:
        if m["role"] == "system" and "tools" in m:
            tools = m["tools"]
    return tools or None


def uses_tools(messages: list[dict]) -> bool:
    """Whether a conversation has tools, tool calls or tool results (chat_spans sends it the prefix way)."""
    return any(m["role"] == "tool" or "tools" in m or "tool_calls" in m for m in messages)


_DUMP = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def tool_text(m: dict) -> str:
    """The tool specs and calls of a message as compact JSON ("" when none): what the bound on a conversation's text
    counts, and what is searched for spelt special tokens."""
    if "tools" not in m and "tool_calls" not in m:
        return ""  # most messages: no encoder started
    return "".join(_DUMP.encode(m[k]) for k in TOOL_KEYS if k in m)
