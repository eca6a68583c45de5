"""Chat templates are untrusted code, and a conversation is held whole (issue 21): a template with a nested loop
rendered for ever, `{{ 'a' * 4000000000 }}` took 4-5 GB then a traceback, and one 25 MB conversation took 2.9 GB
in chat prepare. Renderings are bounded in time and size (minilmd/corpus/chat_sandbox.py): a conversation beyond
the bound is a bad line, `template_limit`; a template beyond it on most conversations ends prepare with exit 65;
a conversation with far more text than seq_len tokens can hold is a bad line, `conversation_too_long`, before it
is rendered, and every other conversation gives the tokens it gave before."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from chat_helpers import TEST_TEMPLATE, a, chat_tokenizer_dir, u, write_chat_jsonl
from minilmd.cli import app
from minilmd.corpus.chat import ChatError, ChatTemplate, TurnError
from minilmd.corpus.chat_budget import TemplateLimits
from minilmd.corpus.prepare.chat_encode import MIN_TEXT_LIMIT

pytestmark = pytest.mark.slow  # each hostile template renders until its bound trips (about a second each)

HOSTILE = {
    "repeat": "{{ 'a' * 4000000000 }}",
    "list_repeat": "{{ ([1] * 100000) * 100000 }}",
    "nested_loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loop_over_a_list": "{% set L = range(100000)|list %}{% for i in L %}{% for j in L %}{% endfor %}{% endfor %}",
    "output": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "macro_buffer": "{% macro f() %}{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}"
                    "{% endfor %}{% endmacro %}{{ f() }}",
    "doubling": "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
                "{{ ns.s|length }}",
    "doubling_plus": "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}",
    "shared_tree": "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}"
                   "{% endfor %}{{ ns.l }}",
    "center": "{{ 'a'|center(4000000000) }}",
    "center_method": "{{ 'a'.center(4000000000) }}",
    "printf": "{{ '%4000000000s' % 'a' }}",
    "format_width": "{{ '{:>4000000000}'.format('a') }}",
    "format_nested_width": "{{ '{:>{}}'.format('a', 4000000000) }}",
    "join_filter": "{{ range(100000)|list|join('x' * 100000) }}",
    "join_method": "{{ ('x' * 100000).join(range(100000)|map('string')) }}",
    "replace": "{{ ('a' * 1000000).replace('a', 'bbbbbbbbbb') }}",
    "indent": "{{ ('a\\n' * 100000)|indent(100000) }}",
    "power": "{{ 10 ** 1000000000 }}",
    "strftime": "{{ strftime_now('%1000000000Y') }}",
}
"""Each renders for ever or builds gigabytes without the bounds."""
MESSAGES = [u("你好"), a("你好！")]


def template_with(snippet: str, when: str = "true") -> str:
    """TEST_TEMPLATE that also renders `snippet` inside every assistant turn for which `when` holds."""
    hook = "{%- generation %}"
    return TEST_TEMPLATE.replace(hook, f"{{%- if {when} %}}{snippet}{{% endif %}}\n        {hook}")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_template_is_a_bad_line_template_limit(name):
    template = ChatTemplate(template_with(HOSTILE[name]), {"bos_token": "<|im_start|>"}, TemplateLimits(seconds=0.5))
    with pytest.raises(TurnError) as got:
        template.targets(MESSAGES)
    assert got.value.reason == "template_limit", got.value.detail
    with pytest.raises(ChatError, match="went beyond its bound"):  # inference (sample --chat) renders with render
        template.render(MESSAGES, add_generation_prompt=True)


def test_bounds_leave_ordinary_templates_as_they_were():
    plain = ChatTemplate(TEST_TEMPLATE, {"bos_token": "<|im_start|>"})
    everyday = ChatTemplate(template_with("{{ ('-' * 10) ~ ('%5s' % 'x') ~ '{:>3}'.format(1) ~ 'ab'|center(6) ~ "
                                          "messages|map(attribute='content')|join(',') ~ (2 ** 10) }}",
                                          "false"), {"bos_token": "<|im_start|>"})
    long = [u("问" * 100_000), a("答" * 100_000)]
    for messages in (MESSAGES, long):
        assert plain.targets(messages) == everyday.targets(messages)
    text = ChatTemplate("{{ ('-' * 10) ~ ('%5s' % 'x') ~ '{:>3}'.format(1) ~ 'ab'|center(6) ~ "
                        "messages|map(attribute='content')|join(',') ~ (2 ** 10) ~ [1, [2]] }}", {}).render(MESSAGES)
    assert text == "----------    x  1  ab  你好,你好！1024[1, [2]]"


def chat_tokenizer_with(tmp_path: Path, chat_tokenizer: Path, template: str) -> Path:
    return chat_tokenizer_dir(chat_tokenizer / "tokenizer.json", tmp_path / "tok", template) / "tokenizer.json"


def conversations(n: int) -> list[list[dict]]:
    return [[u(f"问题 {i}"), a(f"回答 {i}")] for i in range(n)]


def prepare_chat(src: Path, tok: Path, out: Path, *extra: str):
    return CliRunner().invoke(app, ["prepare", str(src), "--tokenizer", str(tok), "--format", "chat", "--out",
                                    str(out), "--val-fraction", "0", "--workers", "0", *extra])


def test_prepare_a_conversation_beyond_the_template_bound_is_a_bad_line(tmp_path, chat_tokenizer):
    boom = template_with(HOSTILE["repeat"], "message['content'] == 'boom'")
    tok = chat_tokenizer_with(tmp_path, chat_tokenizer, boom)
    convs = conversations(30)
    convs.insert(9, [u("问"), a("boom")])  # line 10
    src = write_chat_jsonl(tmp_path / "c.jsonl", convs)
    r = prepare_chat(src, tok, tmp_path / "a")
    assert r.exit_code == 65, r.output
    assert "c.jsonl:10: template limit (a repetition of 4,000,000,000" in r.output
    r = prepare_chat(src, tok, tmp_path / "b", "--on-bad-line", "skip", "--workers", "1")  # in a worker process
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert meta["bad_lines"]["by_reason"] == {"template_limit": 1}
    assert meta["splits"]["train"]["documents"] == 30


@pytest.mark.parametrize("name", ["repeat", pytest.param("nested_loop", marks=pytest.mark.slow)])
def test_prepare_with_a_template_beyond_its_bound_on_most_lines_exits_65(tmp_path, chat_tokenizer, name):
    tok = chat_tokenizer_with(tmp_path, chat_tokenizer, template_with(HOSTILE[name]))
    src = write_chat_jsonl(tmp_path / "c.jsonl", conversations(30))
    r = prepare_chat(src, tok, tmp_path / "out", "--on-bad-line", "skip")
    assert r.exit_code == 65, r.output
    assert "the template is the problem" in r.output
    assert not (tmp_path / "out").exists()


def test_a_conversation_far_beyond_seq_len_is_a_bad_line_and_the_others_keep_their_tokens(tmp_path, chat_tokenizer):
    tok = chat_tokenizer / "tokenizer.json"
    convs = conversations(40)
    src_plain = write_chat_jsonl(tmp_path / "plain.jsonl", convs)
    within = [u("长" * (MIN_TEXT_LIMIT - 10)), a("好")]  # at the bound: kept (cut at seq_len) as before
    beyond_text = [u("长" * (MIN_TEXT_LIMIT + 1)), a("好")]  # beyond the text bound, a line of ~200 KB
    beyond_line = [u("长 " * 400_000), a("好")]  # a line of 1.6 MB: not even held
    src = write_chat_jsonl(tmp_path / "mixed.jsonl", convs[:5] + [within] + convs[5:20] + [beyond_text] + convs[20:30]
                           + [beyond_line] + convs[30:])
    r = prepare_chat(src, tok, tmp_path / "mixed", "--on-bad-line", "skip", "--seq-len", "64")
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "mixed" / "meta.json").read_text())
    assert meta["bad_lines"]["by_reason"] == {"conversation_too_long": 2}
    assert "mixed.jsonl:22: conversation too long" in json.dumps(meta["bad_lines"]["examples"], ensure_ascii=False)
    r = prepare_chat(src_plain, tok, tmp_path / "plain", "--seq-len", "64")
    assert r.exit_code == 0, r.output
    r = prepare_chat(write_chat_jsonl(tmp_path / "within.jsonl", convs[:5] + [within] + convs[5:]), tok,
                     tmp_path / "within", "--seq-len", "64")
    assert r.exit_code == 0, r.output
    mixed, within_tokens = (np.fromfile(tmp_path / d / "train" / "tokens.bin", dtype="<u2")
                            for d in ("mixed", "within"))
    assert np.array_equal(mixed, within_tokens)  # the two bad lines took nothing, the rest as without them
    r = prepare_chat(src, tok, tmp_path / "strict", "--seq-len", "64")
    assert r.exit_code == 65 and "mixed.jsonl:22: conversation too long (65,538 characters" in r.output


@pytest.mark.slow
def test_a_25_mb_conversation_takes_a_bounded_memory(tmp_path, chat_tokenizer):
    big = [u("这是一个很长的对话内容，用来测试内存。" * 450_000), a("好的。")]  # a line of 25 MB
    src = write_chat_jsonl(tmp_path / "c.jsonl", conversations(20) + [big] + conversations(20))
    cmd = [sys.executable, "-m", "minilmd.cli", "prepare", str(src), "--tokenizer", str(chat_tokenizer /
           "tokenizer.json"), "--format", "chat", "--out", str(tmp_path / "out"), "--workers", "0",
           "--val-fraction", "0", "--on-bad-line", "skip"]
    wrapper = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    peak_kib = int(done.stdout.split()[-1])
    assert peak_kib < 300 * 1024, f"prepare peaked at {peak_kib / 1024:.0f} MiB"  # 3.4 GB before
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["bad_lines"]["by_reason"] == {"conversation_too_long": 1}
