"""MiniMind's tool-call schema in chat corpora (minilmd/corpus/chat_tools.py): `tools` on a system message,
`tool_calls` on an assistant one, `role: "tool"` results, nulls as absent keys. The tokens and targets equal
those of MiniMind's own SFTDataset (dataset/lm_dataset.py, run on the same line where ../shared is at hand); a
typo is still refused by name."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types

import numpy as np
import pytest

from chat_helpers import CALLS, MINIMIND_DIR, TOOLS, chat_tokenizer_dir, tool_line
from data_helpers import REPO
from minilmd.corpus.chat import ChatTemplate, check_conversation, read_tokenizer_config
from minilmd.corpus.format import open_prepared

MINIMIND_SRC = REPO / ".." / "shared" / "minimind"

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
    (lambda c: c[1].update(tools=json.dumps(TOOLS)), "bad_tools", "MiniMind reads them from a system message only"),
    (lambda c: c[0].update(tools="[{not json"), "bad_tools", 'message 0 "tools" is a string that is not JSON'),
    (lambda c: c[0].update(tools=json.dumps(TOOLS[0])), "bad_tools", "a JSON dict, not a list"),
    (lambda c: c[0].update(tools=["get_weather"]), "bad_tools", "entry 0 is a JSON str, not an object"),
    (lambda c: c[3].update(tool_calls=json.dumps(CALLS)), "bad_tool_calls", "only an assistant message makes calls"),
    (lambda c: c[2].update(tool_calls=[{"arguments": {}}]), "bad_tool_calls", 'entry 0: no string "name"'),
    (lambda c: c[2].update(tool_calls=[{"function": {"name": "f"}}]), "bad_tool_calls", '"arguments" is neither'),
    (lambda c: c[3].update(content=None), "content_not_string", 'message 3 "content" is a JSON NoneType'),
    (lambda c: c[0].update(tools=[{"name": "\udc80"}]), "invalid_utf8", "message 0 tools or tool_calls: lone"),
    (lambda c: c[2].update(tool_calls='[{"name": "f", "arguments": "\\udc80"}]'), "invalid_utf8", "surrogate"),
    (lambda c: c[0].update(tools="[" * 200 + "]" * 200), "bad_tools", "nested deeper than"),
    (lambda c: c[1].update(role="function"), "unknown_role", "(allowed: system, user, assistant, tool)"),
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


def _minimind_lm_dataset(monkeypatch):
    """MiniMind's own lm_dataset.py, imported from ../shared. Where HF `datasets` is not installed, its
    `load_dataset(..., features=...)` is played by a stand-in doing what `datasets` does with that schema: every
    message holds exactly the schema's keys, null where the line has none. MiniMind's random system prompt and
    empty-think removal are turned off (random.random() = 0: a line with tools never gets the system prompt)."""
    def load_dataset(kind, data_files, split, features=None):
        keys = list(features["conversations"][0])
        with open(data_files, encoding="utf-8") as f:
            rows = [json.loads(x) for x in f if x.strip()]
        return [{"conversations": [{k: m.get(k) for k in keys} for m in r["conversations"]]} for r in rows]

    if importlib.util.find_spec("datasets") is None:
        stub = types.ModuleType("datasets")
        stub.load_dataset, stub.Features, stub.Sequence, stub.Value = load_dataset, dict, list, lambda kind: kind
        monkeypatch.setitem(sys.modules, "datasets", stub)
    spec = importlib.util.spec_from_file_location("minimind_lm_dataset", MINIMIND_SRC / "dataset" / "lm_dataset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module.random, "random", lambda: 0.0)
    return module


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
    module = _minimind_lm_dataset(monkeypatch)
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
