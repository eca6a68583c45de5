"""Chat data for the tests: a chat template for the tests' small tokenizer, conversations from chatterbot-corpus
(minilmd/corpus/demo_chat.py), hand-made conversations that exercise a template, and a prepared chat corpus.

TEST_TEMPLATE is written for these tests (not copied from anywhere): ChatML turns like MiniMind's, with MiniMind's
empty think block in every reply, a default system message when the conversation has none, `raise_exception` for
a role it does not know, `bos_token` from tokenizer_config.json, and plain `{% %}` tags on lines of their own, so
that a renderer without transformers' trim_blocks/lstrip_blocks renders other text. The reply is wrapped in
`{% generation %}`, so that transformers' own `return_assistant_tokens_mask` gives an independent loss mask.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import types
from pathlib import Path

from chat_synthetic import TEMPLATE_CONFIG
from data_helpers import MINIMIND_TOKENIZER, REPO
from minilmd.corpus.chat import ChatTemplate, TurnError
from minilmd.corpus.chat_files import load_template, read_tokenizer_config
from minilmd.corpus.demo_chat import preference_pairs  # noqa: F401 - the tests' pairs are the demo's

TEST_TEMPLATE = """{%- set ns = namespace(first=0) %}
{% if messages[0]['role'] == 'system' %}
    {{- bos_token + 'system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- set ns.first = 1 %}
{% else %}
    {{- bos_token + 'system\n你是助手<|im_end|>\n' }}
{%- endif %}
{% for message in messages[ns.first:] %}
    {% if message['role'] == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
        {{- '<think>\n\n</think>\n\n' + message['content'] | trim + '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}
    {%- elif message['role'] in ['user', 'system'] %}
        {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- raise_exception('unknown role: ' + message['role']) }}
    {%- endif %}
{% endfor %}
{% if add_generation_prompt %}
    {{- '<|im_start|>assistant\n<think>\n\n</think>\n\n' }}
{%- endif %}
"""

MINIMIND_DIR = MINIMIND_TOKENIZER.parent
MINIMIND_SRC = REPO / ".." / "shared" / "minimind"
"""MiniMind's source (dataset/lm_dataset.py), where ../shared is at hand."""


def minimind_dir() -> Path | None:
    """MiniMind's tokenizer directory (MINIMIND_DIR, or $MINIMIND_TOKENIZER_DIR) where it holds its chat template."""
    for d in (MINIMIND_DIR, Path(os.environ.get("MINIMIND_TOKENIZER_DIR", MINIMIND_DIR))):
        if (d / "tokenizer_config.json").is_file():
            return d
    return None


def chat_templates(chat_tokenizer: Path) -> dict[str, tuple[ChatTemplate, str]]:
    """The templates the chat tests render with, name -> (template, its tokenizer.json text): the tests' own
    ("test"), chat_synthetic's ("synthetic") and MiniMind's ("minimind") where it is found."""
    tok = (chat_tokenizer / "tokenizer.json").read_text(encoding="utf-8")
    out = {"test": (load_template(chat_tokenizer), tok),
           "synthetic": (ChatTemplate.from_config(TEMPLATE_CONFIG), tok)}
    found = minimind_dir()
    if found is not None:
        out["minimind"] = (ChatTemplate.from_config(read_tokenizer_config(found)),
                           (found / "tokenizer.json").read_text(encoding="utf-8"))
    return out


def outcome(call, messages):
    """call(messages), or a refusal (TurnError) as ("refused", reason, detail): two ways compared by their answers."""
    try:
        return call(messages)
    except TurnError as e:
        return ("refused", e.reason, e.detail)


def chat_tokenizer_dir(tokenizer_json: Path, out: Path, template: str = TEST_TEMPLATE) -> Path:
    """A tokenizer directory transformers loads: tokenizer.json and a tokenizer_config.json with `template`."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_json, out / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "add_bos_token": False,
              "add_eos_token": False, "clean_up_tokenization_spaces": False, "model_max_length": 4096,
              "chat_template": template}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return out


CHAT_SCAFFOLD = "system\n你是助手 user\n assistant\n<think>\n\n</think>\n\n"
"""The template's own text, so that a tokenizer trained for chat has tokens for it (repeated in its training)."""


def chat_bpe(text_jsonl: list[str], chat_jsonl: list[Path], out: Path, vocab_size: int = 2048) -> Path:
    """A byte-level BPE (MiniMind's special ids) trained on text JSONL, the messages of chat JSONL and the
    template's scaffolding: with 2048 entries a chatterbot dialog is a few dozen tokens (with 512 most of them
    would be cut at 128)."""
    from data_helpers import read_texts
    from minilmd.corpus.tokenizer_train import train_tokenizer

    texts = read_texts(text_jsonl) + ["\n".join(m["content"] for m in c) for c in read_conversations(chat_jsonl)]
    out.parent.mkdir(parents=True, exist_ok=True)
    train_tokenizer(iter(texts + [CHAT_SCAFFOLD] * 50), vocab_size, out)
    return out


def write_chat_jsonl(path: Path, conversations: list[list[dict]]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for messages in conversations:
            f.write(json.dumps({"conversations": messages}, ensure_ascii=False) + "\n")
    return path


def read_conversations(paths: list[Path]) -> list[list[dict]]:
    return [json.loads(line)["conversations"] for p in paths for line in Path(p).read_text("utf-8").splitlines()]


def u(text: str) -> dict:
    return {"role": "user", "content": text}


def a(text: str) -> dict:
    return {"role": "assistant", "content": text}


def s(text: str) -> dict:
    return {"role": "system", "content": text}


HAND_MADE = [
    [u("你好"), a("你好！有什么可以帮你？")],
    [s("你是一个乐于助人的助手。"), u("一加一等于几？"), a("等于二。")],
    [u("hi"), a("hello"), u("how are you?"), a("fine, thanks"), u("bye"), a("bye!")],
    [s("Answer briefly."), u("Name a colour."), a("  Blue.  \n")],
    [u("emoji 🎉 and combining é (e\u0301) and tabs\tand\nnewlines"), a("收到 🎉\n\n第二段。")],
    [u("<think>用户写的</think>"), a("<think>\n推理过程\n</think>\n\n结论是 42。")],
    [u("多轮一"), a("答一"), s("中途的系统消息"), u("多轮二"), a("答二")],
    [u(""), a("empty question, real answer")],
    [u("空回答"), a("")],
    [{"role": "user", "content": "带推理字段"},
     {"role": "assistant", "content": "答案", "reasoning_content": "先想一想"}],
    [u("长" * 300), a("短")],
]
"""Conversations that exercise a template: system or not, multi-turn, a system message mid-way, unicode, white
space around a reply, a think block written by the user and by the assistant, empty turns, reasoning_content."""


def chatterbot_slice(out_dir: Path, english: int = 300) -> list[Path]:
    """chatterbot-corpus's Chinese dialogs (all 467) and its first `english` English ones, as chat JSONL."""
    from minilmd.corpus.demo_chat import write_chat_corpus

    chinese = write_chat_corpus(out_dir, ("chinese",))
    return chinese + write_chat_corpus(out_dir, ("english",), max_conversations=english)


def prepared_chat(sources: list[Path], tokenizer_dir: Path, out: Path, seq_len: int = 128, batch_size: int = 8,
                  val_fraction: float = 0.05, **kw) -> Path:
    from minilmd.corpus.prepare.pipeline import prepare

    kw = {"data_format": "chat", **kw}
    prepare([str(p) for p in sources], tokenizer_dir, out, seq_len=seq_len,
            batch_size=batch_size, val_fraction=val_fraction, workers=0, progress=False, log=lambda m: None, **kw)
    return out


def write_jsonl(path: Path, objects: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for obj in objects:
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return path


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "查询城市天气",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALLS = [{"name": "get_weather", "arguments": {"city": "北京"}}]


def tool_line(as_strings: bool = True, nulls: bool = True) -> dict:
    """A MiniMind SFT line with tools: its files hold `tools` and `tool_calls` as JSON strings, and HF `datasets`
    writes every key of the schema, null where a message has none."""
    dump = (lambda v: json.dumps(v, ensure_ascii=False)) if as_strings else (lambda v: v)
    none = {"tools": None, "tool_calls": None, "reasoning_content": None} if nulls else {}
    return {"conversations": [
        {**none, "role": "system", "content": "你是一个助手。", "tools": dump(TOOLS)},
        {**none, "role": "user", "content": "北京今天天气怎么样？"},
        {**none, "role": "assistant", "content": None if nulls else "", "tool_calls": dump(CALLS)},
        {**none, "role": "tool", "content": '{"temp": 3, "sky": "晴"}'},
        {**none, "role": "tool", "content": '{"wind": "北风"}'},
        {**none, "role": "assistant", "content": "北京今天晴，3度，北风。"},
        {**none, "role": "user", "content": "谢谢"},
        {**none, "role": "assistant", "content": "不客气。", "reasoning_content": "礼貌回应"},
    ]}


def tool_conversations() -> list[list[dict]]:
    """Checked tool-call conversations (chat.check_conversation) in the shapes MiniMind's template renders
    differently: tool_line's, a reply with text before two calls (one OpenAI-style, its arguments a string), a
    system message with tools after the first message, tools without a system message's text first, and calls
    without a name (a result with OpenAI's `tool_call_id` and `name`, dropped)."""
    from minilmd.corpus.chat import check_conversation

    first = check_conversation(tool_line())[0]
    wrapped = [{"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "上海"}'}},
               {"name": "get_time", "arguments": {}}]
    lines = [tool_line()["conversations"],
             [{"role": "system", "content": "助手", "tools": TOOLS}, {"role": "user", "content": "上海呢？"},
              {"role": "assistant", "content": "我查一下。", "tool_calls": wrapped},
              {"role": "tool", "content": "多云"}, {"role": "tool", "content": "12:00"},
              {"role": "assistant", "content": "<think>\n看结果\n</think>\n\n上海多云。"}],
             [{"role": "user", "content": "你好"}, {"role": "system", "content": "可用工具", "tools": TOOLS},
              {"role": "assistant", "content": "", "tool_calls": CALLS}, {"role": "tool", "content": "晴"},
              {"role": "assistant", "content": "晴天。"}],
             [{"role": "user", "content": "几点了？"},  # calls without a name: MiniMind's template writes ""
              {"role": "assistant", "content": "查询中", "tool_calls": [{"arguments": {}},
                                                                     {"function": {"arguments": "{}"}}]},
              {"role": "tool", "content": "12:00", "tool_call_id": "c1", "name": "get_time"},
              {"role": "assistant", "content": "十二点。"}]]
    out = [check_conversation({"conversations": c})[0] for c in lines]
    assert all(out) and out[0] == first
    return out


def minimind_lm_dataset(monkeypatch):
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
