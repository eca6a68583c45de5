"""MiniMind's tool-call schema in chat corpora (minilmd/corpus/chat_tools.py): `tools` on a system message,
`tool_calls` on an assistant one, `role: "tool"` results, nulls as absent keys. The tokens and targets equal
those of MiniMind's own SFTDataset (dataset/lm_dataset.py, run on the same line where ../shared is at hand); a
typo is still refused by name."""
from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
import pytest

from chat_helpers import CALLS, MINIMIND_DIR, MINIMIND_SRC, TOOLS, chat_tokenizer_dir, minimind_lm_dataset, tool_line
from minilmd.corpus.chat import ChatTemplate, check_conversation
from minilmd.corpus.chat_files import read_tokenizer_config
from minilmd.corpus.format import open_prepared

TOOL_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n' + messages[0].content + '\\n<tools>' + tools | tojson + '</tools><|im_end|>\\n' }}
{%- endif %}
{%- for m in messages %}
{%- if loop.first and tools %}
{%- elif m.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>' + m.content + '</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + m.role + '\\n' + m.content }}
{%- for c in m.tool_calls or [] %}{{- '<tool_call>' + c | tojson + '</tool_call>' }}{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}"""
"""A ChatML template of the tests' own that renders tools (specs in the system turn, calls in the reply, results
as a user turn), for the tests that run without MiniMind's."""


def test_a_tool_call_line_is_accepted_its_nulls_absent_and_its_strings_parsed():
    messages, bad = check_conversation(tool_line())
    assert bad is None
    assert messages[0]["tools"] == TOOLS and messages[2] == {"role": "assistant", "content": "", "tool_calls": CALLS}
    assert all("reasoning_content" not in m for m in messages[:-1]) and messages[-1]["reasoning_content"] == "礼貌回应"
    assert [m["role"] for m in messages].count("tool") == 2
    # The same line with lists instead of JSON strings, or without the nulls, is the same conversation.
    assert check_conversation(tool_line(as_strings=False, nulls=False)) == (messages, None)


@pytest.mark.parametrize("change, reason, words", [
    (lambda c: c[1].update(tool_call="x"), "unknown_message_key",
     "message 1 has 'tool_call' (allowed: role, content, reasoning_content, tools, tool_calls)"),
    (lambda c: c[0].update(tools="[{not json"), "bad_tools", 'message 0 "tools" is a string that is not JSON'),
    (lambda c: c[0].update(tools=json.dumps(TOOLS[0])), "bad_tools", "a JSON dict, not a list"),
    (lambda c: c[0].update(tools=["get_weather"]), "bad_tools", "entry 0 is a JSON str, not an object"),
    (lambda c: c[3].update(tool_calls="[{x"), "bad_tool_calls", 'message 3 "tool_calls" is a string that is not'),
    (lambda c: c[2].update(tool_calls=[{"function": {"name": "f"}}]), "bad_tool_calls", 'entry 0: no "arguments"'),
    (lambda c: c[2].update(tool_calls=[{"function": "f", "arguments": {}}]), "bad_tool_calls",
     'entry 0: "function" is a JSON str, not an object'),
    (lambda c: c[3].update(tool_call_id="c1", toolcallid="c1"), "unknown_message_key", "message 3 has 'toolcallid' ("),
    (lambda c: c[0].update(content=None), "content_not_string", 'message 0 "content" is null on the first message'),
    (lambda c: c[0].update(tools=[{"name": "\udc80"}]), "invalid_utf8", "message 0 tools or tool_calls: lone"),
    (lambda c: c[2].update(tool_calls='[{"name": "f", "arguments": "\\udc80"}]'), "invalid_utf8", "surrogate"),
    (lambda c: c[0].update(tools="[" * 200 + "]" * 200), "bad_tools", "nested deeper than"),
    (lambda c: c[1].update(role="function"), "unknown_role", "(allowed: system, user, assistant, tool)"),
    # A null reply without calls trained '<think>\n\n</think>\n\n<|im_end|>': an empty answer (user10 #3).
    (lambda c: c[2].pop("tool_calls"), "empty_reply", 'message 2 is the assistant\'s with a null "content" and no'),
    (lambda c: c[2].update(tool_calls="[]"), "empty_reply", "train the model to answer with an empty reply"),
])
def test_what_minimind_could_not_render_and_typos_are_still_bad_lines_named(change, reason, words):
    line = tool_line()
    change(line["conversations"])
    messages, bad = check_conversation(line)
    assert messages is None and bad[0] == reason and words in bad[1], bad


def test_a_preference_pair_keeps_the_three_roles_and_keys():
    from minilmd.corpus.prepare.dpo_encode import parse_pair_block

    conv = tool_line()["conversations"]
    line = json.dumps({"chosen": conv, "rejected": conv}, ensure_ascii=False).encode("utf-8") + b"\n"
    bad = parse_pair_block(line, 1).bad
    assert len(bad) == 1 and bad[0][1] == "unknown_message_key" and "allowed: role, content, reasoning_content)" \
        in bad[0][2]


def test_prepare_renders_tool_calls_trains_the_calls_and_not_the_results(tokenizer, tmp_path):
    # Before tool calls were read, this line was `unknown message key`, exit 65, nothing written.
    tok_dir = chat_tokenizer_dir(tokenizer, tmp_path / "tok", TOOL_TEMPLATE)
    src = tmp_path / "sft_tools.jsonl"
    src.write_text(json.dumps(tool_line(), ensure_ascii=False) + "\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "minilmd.cli", "prepare", str(src), "--tokenizer", str(tok_dir),
                           "--out", str(tmp_path / "out"), "--format", "chat", "--workers", "0", "--seq-len", "2048",
                           "--val-fraction", "0"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    pc = open_prepared(tmp_path / "out")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    ids, mask = np.asarray(pc.train.document(0)), np.asarray(pc.train.document_mask(0))
    text = tok.decode(ids.tolist(), skip_special_tokens=False)
    trained = tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False)
    assert '<tools>[{"type": "function"' in text and "<tool_response>{\"temp\": 3" in text
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "北京"}}</tool_call><|im_end|>' in trained
    assert "北京今天晴" in trained and "不客气" in trained
    assert "tool_response" not in trained and "get_weather" not in trained.split("<tool_call>")[0]  # specs: prompt


@pytest.mark.slow  # transformers loads MiniMind's tokenizer: seconds
@pytest.mark.skipif(not (MINIMIND_SRC / "dataset" / "lm_dataset.py").is_file()
                    or not (MINIMIND_DIR / "tokenizer_config.json").is_file(),
                    reason="MiniMind's source and tokenizer (../shared) are absent")
def test_tokens_and_targets_equal_minimind_s_own_sft_dataset_on_the_same_line(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")  # noqa: F841 - lm_dataset.py imports it
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    from minilmd.corpus.prepare.chat_encode import encode_conversation

    hf = transformers.AutoTokenizer.from_pretrained(str(MINIMIND_DIR))
    line = tool_line()
    src = tmp_path / "sft_tools.jsonl"
    src.write_text(json.dumps(line, ensure_ascii=False) + "\n", encoding="utf-8")
    module = minimind_lm_dataset(monkeypatch)
    theirs = module.SFTDataset(str(src), hf, max_length=2048)
    input_ids, labels = (t.tolist() for t in theirs[0])
    template = ChatTemplate.from_config(read_tokenizer_config(MINIMIND_DIR))
    tok = Tokenizer.from_file(str(MINIMIND_DIR / "tokenizer.json"))
    messages, bad = check_conversation(line)
    assert bad is None
    assert template.render(messages) == theirs.create_chat_prompt(module.pre_processing_chat(
        theirs.samples[0]["conversations"]))
    ids, mask = encode_conversation(tok, template, messages)
    n = ids.size
    assert input_ids[:n] == ids.tolist() and set(input_ids[n:]) == {hf.pad_token_id}
    # MiniMind's labels: each reply after `<|im_start|>assistant\n` through `<|im_end|>\n`; minilmd's targets end
    # at `<|im_end|>` (docs/formats.md): the same tokens but the "\n" after each reply's <|im_end|>.
    theirs_on = {i for i, y in enumerate(labels) if y != -100}
    ours_on = set(np.flatnonzero(mask).tolist())
    newlines = {i + 1 for i in ours_on if ids[i] == 2}
    assert len(newlines) == 3 and theirs_on == ours_on | newlines
    # The tool call is trained, the tool results are not.
    trained = tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False)
    assert '"name": "get_weather"' in trained and "<tool_response>" not in trained


def test_corpus_report_reads_a_tool_call_line_as_text_not_as_a_bad_line():
    from minilmd.corpus.analysis.scan import line_text

    text = line_text(tool_line())  # its first reply's content is null beside its tool_calls
    assert text is not None and "北京今天天气怎么样？" in text and '{"wind": "北风"}' in text
    assert line_text({"conversations": [{"role": "user", "content": None}]}) is None  # still none without calls


# What MiniMind trains on but its template never renders: the key is dropped, the line kept and the key named.
# (MiniMind's own loader, HF datasets 3.6 with its five-key schema, refuses a whole file holding `tool_call_id` or
# `name`; its template ignores them: minilmd drops them the same way.)
DROPPED = {
    "tools on a user message": (lambda c: c[1].update(tools=json.dumps(TOOLS)), "message 1 (role 'user') \"tools\""),
    "tool_calls on a tool result": (lambda c: c[3].update(tool_calls=json.dumps(CALLS)),
                                    "message 3 (role 'tool') \"tool_calls\""),
    "tool_call_id": (lambda c: c[3].update(tool_call_id="call_1"), "message 3 (role 'tool') \"tool_call_id\""),
    "name": (lambda c: c[4].update(name="get_weather"), "message 4 (role 'tool') \"name\""),
}


def _changed(change) -> dict:
    line = tool_line()
    change(line["conversations"])
    return line


@pytest.mark.parametrize("what", DROPPED)
def test_a_key_minimind_trains_on_but_never_renders_is_dropped_and_named(what):
    change, named = DROPPED[what]
    ignored: list[str] = []
    messages, bad = check_conversation(_changed(change), ignored=ignored)
    assert bad is None and messages == check_conversation(tool_line())[0]  # the line as if it had no such key
    assert ignored == [named]
    ignored.clear()
    check_conversation(_changed(lambda c: c[3].update(tool_call_id=None)), ignored=ignored)
    assert ignored == []  # a null one is an absent key: nothing dropped


NAMELESS_TURN = ('<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{"name": "", "arguments": {"city": '
                 '"北京"}}\n</tool_call><|im_end|>\n')
"""The turn MiniMind's template writes for a reply whose call has no name, derived by hand from its text: the
empty think block, no content, then `{{- tool_call.name }}` of an undefined name, "", and the arguments `tojson`."""


@pytest.mark.parametrize("template", ["built-in", "MiniMind's"])
def test_a_call_without_a_name_renders_as_minimind_s_template_renders_it(template):
    from minilmd.corpus.chat_templates import MINIMIND_TEMPLATE, tokenizer_config

    if template == "MiniMind's" and not (MINIMIND_DIR / "tokenizer_config.json").is_file():
        pytest.skip("MiniMind's tokenizer (../shared) is absent")
    config = (read_tokenizer_config(MINIMIND_DIR) if template == "MiniMind's"
              else tokenizer_config(MINIMIND_TEMPLATE))
    messages, bad = check_conversation(_changed(lambda c: c[2].update(tool_calls=[{"arguments": {"city": "北京"}}])))
    assert bad is None  # before: `bad_tool_calls`, `entry 0: no string "name"`
    text = ChatTemplate.from_config(config).render(messages)
    assert NAMELESS_TURN in text


def test_prepare_keeps_the_lines_and_names_the_keys_it_dropped(tokenizer, tmp_path):
    # Before, each line but the first was a bad line (`unknown_message_key`, `bad_tools`): exit 65, nothing written.
    tok_dir = chat_tokenizer_dir(tokenizer, tmp_path / "tok", TOOL_TEMPLATE)
    src = tmp_path / "sft_tools.jsonl"
    lines = [tool_line()] + [_changed(change) for change, _ in DROPPED.values()]
    src.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "minilmd.cli", "prepare", str(src), "--tokenizer", str(tok_dir),
                           "--out", str(tmp_path / "out"), "--format", "chat", "--workers", "0", "--seq-len", "2048",
                           "--val-fraction", "0"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text(encoding="utf-8"))
    assert meta["splits"]["train"]["documents"] == 5 and meta["chat"]["conversations_with_ignored_keys"] == 4
    assert meta["chat"]["ignored_keys_examples"] == [f"{src}:{n}: {named}" for n, (_, named) in
                                                     enumerate(DROPPED.values(), start=2)]
    said = proc.stdout + proc.stderr
    assert "kept without keys MiniMind's template never renders: 4 conversations" in said
    assert f"{src}:2: message 1 (role 'user') \"tools\"" in said
    docs = [np.asarray(open_prepared(tmp_path / "out").train.document(k)).tolist() for k in range(5)]
    assert all(d == docs[0] for d in docs)  # each rendered as the line without the key


@pytest.mark.slow  # transformers loads MiniMind's tokenizer: seconds
@pytest.mark.skipif(not (MINIMIND_SRC / "dataset" / "lm_dataset.py").is_file()
                    or not (MINIMIND_DIR / "tokenizer_config.json").is_file(),
                    reason="MiniMind's source and tokenizer (../shared) are absent")
def test_the_lines_render_as_minimind_s_create_chat_prompt_renders_them(monkeypatch):
    """MiniMind's own create_chat_prompt (transformers' apply_chat_template on MiniMind's template) given each
    line's messages as they are, every key kept (the schema's nulls included), equals minilmd's rendering."""
    pytest.importorskip("torch")  # lm_dataset.py imports it
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(MINIMIND_DIR))
    sft = types.SimpleNamespace(tokenizer=hf)
    module = minimind_lm_dataset(monkeypatch)
    template = ChatTemplate.from_config(read_tokenizer_config(MINIMIND_DIR))
    nameless = _changed(lambda c: c[2].update(tool_calls=json.dumps([{"arguments": {"city": "北京"}}])))
    for line in [nameless] + [_changed(change) for change, _ in DROPPED.values()]:
        messages, bad = check_conversation(line)
        assert bad is None
        theirs = module.SFTDataset.create_chat_prompt(sft, module.pre_processing_chat(line["conversations"]))
        assert template.render(messages) == theirs
