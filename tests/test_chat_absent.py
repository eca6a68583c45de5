"""One rule for an absent message key, as MiniMind trains on it (minilmd/corpus/chat_tools.py `without_absent`):
a null value, and an empty string in `tools` or `tool_calls`, is an absent key; a tool value spelling an empty one
("null", "[]", "{}") renders nothing, a later system message's replacing earlier tools; a null or absent content is
"" but on a first system message; a preference pair's sides drop OpenAI's `tool_call_id` and `name` as a chat
line's messages do. Each rendering is checked against MiniMind's template (its own tokenizer_config.json where
../shared is at hand, else minilmd's built-in copy), and against MiniMind's own create_chat_prompt (slow)."""
from __future__ import annotations

import json
import types

import pytest

from chat_helpers import CALLS, MINIMIND_DIR, MINIMIND_SRC, TOOLS, a, minimind_lm_dataset, s, u
from minilmd.corpus.chat import ChatTemplate, check_conversation
from minilmd.corpus.chat_files import read_tokenizer_config
from minilmd.corpus.chat_templates import MINIMIND_TEMPLATE, tokenizer_config
from minilmd.corpus.prepare.dpo_encode import parse_pair_block
from minilmd.corpus.prepare.pipeline import prepare

BASE_TEXT = ("<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
             "<|im_start|>assistant\n<think>\n\n</think>\n\nok<|im_end|>\n")
"""What MiniMind's create_chat_prompt renders for [system "sys", user "hi", assistant "ok"], each of the lines of
test_an_empty_tool_value_renders_nothing_as_minimind_s_template_does too (printed by transformers 4.x on
MiniMind's tokenizer)."""


@pytest.fixture(scope="module", params=["built-in", "MiniMind's"])
def template(request) -> ChatTemplate:
    if request.param == "MiniMind's" and not (MINIMIND_DIR / "tokenizer_config.json").is_file():
        pytest.skip("MiniMind's tokenizer (../shared) is absent")
    config = (read_tokenizer_config(MINIMIND_DIR) if request.param == "MiniMind's"
              else tokenizer_config(MINIMIND_TEMPLATE))
    return ChatTemplate.from_config(config)


def _base() -> list[dict]:
    return [s("sys"), u("hi"), a("ok")]


def _with(index: int, **keys) -> list[dict]:
    conv = _base()
    conv[index] = {**conv[index], **keys}
    return conv


EMPTY_TOOL_VALUES = [(key, index, value) for key, index in (("tools", 0), ("tool_calls", 2))
                     for value in ("", "null", "[]", "{}", [])]


@pytest.mark.parametrize("key, index, value", EMPTY_TOOL_VALUES)
def test_an_empty_tool_value_renders_nothing_as_minimind_s_template_does(template, key, index, value):
    # Before: "" was `bad_tools`/`bad_tool_calls` ("a string that is not JSON"), "null" and "{}" "not a list".
    ignored: list[str] = []
    messages, bad = check_conversation({"conversations": _with(index, **{key: value})}, ignored=ignored)
    assert bad is None and ignored == []  # nothing MiniMind would render was dropped
    assert template.render(messages) == BASE_TEXT
    assert key == "tools" or messages == check_conversation({"conversations": _base()})[0]  # calls: absent


@pytest.mark.parametrize("value", ["null", "[]", "{}"])
def test_a_later_system_message_s_empty_tools_replace_the_earlier_ones_as_minimind_s_json_loads_does(template,
                                                                                                       value):
    conv = [{**s("sys"), "tools": json.dumps(TOOLS)}, u("hi"), a("ok"), {**s("later"), "tools": value},
            u("again"), a("ok")]
    messages, bad = check_conversation({"conversations": conv})
    assert bad is None and "# Tools" not in template.render(messages)  # MiniMind's `tools` is None, {} or []
    conv[3]["tools"] = ""  # an empty string MiniMind never parses: the earlier tools stay
    messages, bad = check_conversation({"conversations": conv})
    assert bad is None and "# Tools" in template.render(messages)


NULL_CONTENT = {
    "user": (1, [s("sys"), u(None), a("ok")]),
    "tool result": (3, [s("sys"), u("hi"), {**a(""), "tool_calls": json.dumps(CALLS)}, {"role": "tool",
                                                                                         "content": None}, a("ok")]),
    "a later system message": (2, [u("hi"), a("ok"), s(None), u("again"), a("ok")]),
    "absent on a user message": (1, [s("sys"), {"role": "user"}, a("ok")]),
}


@pytest.mark.parametrize("what", NULL_CONTENT)
def test_a_null_content_renders_as_an_empty_one_as_minimind_s_template_does(template, what):
    # Before: `content_not_string` but beside an assistant's tool_calls.
    i, conv = NULL_CONTENT[what]
    messages, bad = check_conversation({"conversations": conv})
    assert bad is None and messages[i]["content"] == ""
    given_empty = [{**m, "content": "" if m.get("content") is None else m["content"]} for m in conv]
    assert template.render(messages) == template.render(check_conversation({"conversations": given_empty})[0])


def test_an_assistant_message_without_content_or_calls_is_a_bad_line_not_an_empty_reply():
    # user10 #3: before, accepted, and its target taught the model to answer nothing
    messages, bad = check_conversation({"conversations": [s("sys"), u("hi"), a(None)]})
    assert messages is None and bad[0] == "empty_reply", bad


@pytest.mark.parametrize("conv", [[s(None), u("hi"), a("ok")], [{"role": "system", "tools": json.dumps(TOOLS)},
                                                                  u("hi"), a("ok")]])
def test_a_first_system_message_without_content_is_bad_as_minimind_s_template_fails_on_it(conv):
    messages, bad = check_conversation({"conversations": conv})
    assert messages is None and bad[0] == "content_not_string" and "first message, a system one" in bad[1]


def test_a_pair_s_tool_call_id_and_name_are_dropped_and_named_as_a_chat_line_s():
    # Before: `unknown_message_key` ("allowed: role, content, reasoning_content"), while a chat line kept them.
    chosen = [{**u("hi"), "name": "bob"}, a("good")]
    rejected = [{**u("hi"), "name": "bob", "tool_call_id": None}, {**a("bad"), "tool_call_id": "c1"}]
    line = json.dumps({"chosen": chosen, "rejected": rejected}).encode() + b"\n"
    parsed = parse_pair_block(line, 7)
    assert parsed.bad == [] and parsed.pairs == [([u("hi"), a("good")], [u("hi"), a("bad")])]
    assert parsed.ignored == [(7, "chosen: message 0 (role 'user') \"name\"; rejected: message 0 (role 'user') "
                                  "\"name\"; rejected: message 1 (role 'assistant') \"tool_call_id\"")]
    bad = parse_pair_block(json.dumps({"chosen": [{**u("hi"), "nmae": "x"}, a("good")], "rejected": rejected})
                           .encode() + b"\n", 1).bad
    assert bad[0][1] == "unknown_message_key" and "chosen: message 0 has 'nmae'" in bad[0][2]  # a typo still


def test_prepare_dpo_keeps_such_a_pair_and_counts_it_in_pairs(tmp_path, chat_tokenizer):
    pairs = [{"chosen": [{**u(f"q{k}"), "name": "bob"}, a(f"good {k}")], "rejected": [u(f"q{k}"), a(f"bad {k}")]}
             for k in range(3)] + [{"chosen": [u("x"), a("yes")], "rejected": [u("x"), a("no")]}]
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    said: list[str] = []
    meta = prepare([str(src)], chat_tokenizer, tmp_path / "dpo", data_format="dpo", progress=False, val_fraction=0.0,
                   seq_len=256, batch_size=4, workers=0, log=said.append)
    assert meta["splits"]["train"]["pairs"] == 4 and meta["chat"]["conversations_with_ignored_keys"] == 3
    assert meta["chat"]["ignored_keys_examples"][0] == f"{src}:1: chosen: message 0 (role 'user') \"name\""
    assert any("kept without keys MiniMind's template never renders: 3 pairs" in line for line in said), said


SCHEMA = ("role", "content", "reasoning_content", "tools", "tool_calls")
"""MiniMind's SFTDataset schema (dataset/lm_dataset.py `Features`)."""


@pytest.mark.slow  # transformers loads MiniMind's tokenizer: seconds
def test_each_line_renders_as_minimind_s_create_chat_prompt_renders_it_or_fails_where_it_fails(monkeypatch):
    pytest.importorskip("torch")  # lm_dataset.py imports it
    transformers = pytest.importorskip("transformers")
    if not (MINIMIND_SRC / "dataset" / "lm_dataset.py").is_file() or not (MINIMIND_DIR / "tokenizer_config.json"
                                                                            ).is_file():
        pytest.skip("MiniMind's source and tokenizer (../shared) are absent")
    sft = types.SimpleNamespace(tokenizer=transformers.AutoTokenizer.from_pretrained(str(MINIMIND_DIR)))
    module = minimind_lm_dataset(monkeypatch)
    template = ChatTemplate.from_config(read_tokenizer_config(MINIMIND_DIR))
    lines = [_with(index, **{key: value}) for key, index, value in EMPTY_TOOL_VALUES if not isinstance(value, list)]
    lines += [[{**s("sys"), "tools": json.dumps(TOOLS)}, u("hi"), a("ok"), {**s("later"), "tools": value},
               u("again"), a("ok")] for value in ("null", "[]", "{}", "")]
    lines += [conv for _, conv in NULL_CONTENT.values()]
    for conv in lines:
        messages, bad = check_conversation({"conversations": conv})
        assert bad is None, (conv, bad)
        as_loaded = [{k: m.get(k) for k in SCHEMA} for m in conv]  # HF datasets' rows: every key, null if none
        theirs = module.SFTDataset.create_chat_prompt(sft, as_loaded)  # (no random system prompt put first)
        assert template.render(messages) == theirs, conv
    with pytest.raises(Exception):  # noqa: B017 - jinja2's UndefinedError, through transformers
        module.SFTDataset.create_chat_prompt(sft, [s(None), u("hi"), a("ok")])
