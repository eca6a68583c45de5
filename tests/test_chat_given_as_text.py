"""Chat data given to a reader of text (`tokenizer train`, `prepare` without --format chat, `prepare --append` into a
text corpus; minilmd/corpus/sources/jsonl.py CHAT_LINE): each line says the "text" key expected and the chat key it
found, and the advice (--format chat) is said once when most lines are chat data, instead of thousands of bare
`missing text` lines and no word of the format."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from minilmd.corpus.prepare.append import append
from minilmd.corpus.prepare.pipeline import prepare
from minilmd.corpus.sources.jsonl import CHAT_ADVICE, TEXT_ADVICE, InputError, parse_block
from minilmd.corpus.sources.train_texts import iter_texts

CHAT = {"conversations": [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好，有什么事？"}]}


def _jsonl(path: Path, chat: int, text: int) -> Path:
    """`chat` lines of chat data, then `text` lines of text."""
    lines = [json.dumps(CHAT, ensure_ascii=False)] * chat
    lines += [json.dumps({"text": f"今天的天气很好，第{i}天我们出去走走。"}, ensure_ascii=False) for i in range(text)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_line_without_text_names_what_it_holds_and_chat_data_is_told_as_such():
    block = parse_block(b'{"conversations": []}\n{"messages": []}\n{"title": "t", "body": "b"}\n{}\n[1]\n', 1)
    assert block.bad == [
        (1, "chat_line", 'a "text" key expected, found "conversations": chat data'),
        (2, "chat_line", 'a "text" key expected, found "messages": chat data'),
        (3, "missing_text", 'line is an object without "text" (its keys: "title", "body")'),
        (4, "missing_text", 'line is an object without "text" (no key at all)'),
        (5, "missing_text", "line is a JSON list"),
    ]


def test_tokenizer_train_on_chat_data_says_the_key_it_expects_what_it_found_and_what_to_do(tmp_path):
    src = _jsonl(tmp_path / "chat.jsonl", chat=3, text=0)
    with pytest.raises(InputError) as e:
        list(iter_texts([str(src)]))
    assert f'{src}:1: chat line (a "text" key expected, found "conversations": chat data)' in str(e.value)
    assert "train the tokenizer on text" in str(e.value)


def test_prepare_of_chat_data_as_text_says_use_format_chat_once(tmp_path, tokenizer):
    src = _jsonl(tmp_path / "chat.jsonl", chat=30, text=5)
    with pytest.raises(InputError) as e:
        prepare([str(src)], tokenizer, tmp_path / "out", workers=0, log=lambda _: None)
    assert str(e.value).count(CHAT_ADVICE) == 1
    assert "30 bad lines (chat line: 30)" in str(e.value)
    said: list[str] = []
    with pytest.raises(InputError) as e:  # every line skipped: no documents; the advice is the error's
        prepare([str(_jsonl(tmp_path / "all-chat.jsonl", chat=30, text=0))], tokenizer, tmp_path / "out2",
                workers=0, on_bad_line="skip", log=said.append)
    assert str(e.value).endswith(f"; {CHAT_ADVICE}")


def test_a_few_chat_lines_in_a_text_corpus_are_bad_lines_without_the_advice(tmp_path, tokenizer):
    src = _jsonl(tmp_path / "mixed.jsonl", chat=2, text=40)
    said: list[str] = []
    prepare([str(src)], tokenizer, tmp_path / "out", workers=0, on_bad_line="skip", val_fraction=0.2,
            log=said.append)
    assert any("chat line" in line for line in said)
    assert not any(CHAT_ADVICE in line for line in said)


def test_append_of_chat_data_to_a_text_corpus_says_it_is_a_text_corpus(tmp_path, tokenizer):
    root = tmp_path / "prepared"
    prepare([str(_jsonl(tmp_path / "text.jsonl", chat=0, text=40))], tokenizer, root, workers=0, val_fraction=0.2,
            log=lambda _: None)
    src = _jsonl(tmp_path / "chat.jsonl", chat=30, text=0)
    with pytest.raises(InputError) as e:
        append([str(src)], root, workers=0, log=lambda _: None)
    assert str(e.value).count("is a text corpus and this looks like chat data") == 1
    assert "prepare it into a corpus of its own with --format chat" in str(e.value)


def test_prepare_of_text_as_chat_says_use_format_text_once_and_lists_the_first_lines_only(tmp_path, chat_tokenizer):
    """The other way round: a text corpus given to `prepare --format chat` was 3,000 bare `missing conversations`
    lines and advice to skip them all; each line now says the key expected and what it found, and the advice
    (--format text) is said once, after the first lines (the rest are in the bad-lines file)."""
    src = _jsonl(tmp_path / "text.jsonl", chat=0, text=300)
    with pytest.raises(InputError) as e:
        prepare([str(src)], chat_tokenizer, tmp_path / "out", data_format="chat", workers=0, log=lambda _: None)
    said = str(e.value)
    assert said.count(TEXT_ADVICE) == 1 and TEXT_ADVICE == \
        'this looks like a text corpus ({"text": ...} lines): use --format text'
    assert "300 bad lines (text line: 300)" in said, said
    assert f'{src}:1: text line (a "conversations" (or "messages") key expected, found "text": text data)' in said
    assert said.count(f"{src}:") <= 25, said  # the first lines, not all 300
    with pytest.raises(InputError) as e:  # every line skipped: no documents; the advice is the error's
        prepare([str(src)], chat_tokenizer, tmp_path / "out2", data_format="chat", workers=0, on_bad_line="skip",
                log=lambda _: None)
    assert str(e.value).endswith(f"; {TEXT_ADVICE}")
