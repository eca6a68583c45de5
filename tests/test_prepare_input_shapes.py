"""Input that is not what `--format` reads, and advice that helps (user walk 5, finding 8).

Before: `prepare chat.jsonl --format dpo` said `467 bad lines (missing chosen rejected 467) ... Fix them or pass
--on-bad-line skip` of a chat corpus whose every line has "conversations"; a UTF-8 byte order mark at a file's start
made line 1 `invalid json (Unexpected UTF-8 BOM ...)`, which skipping dropped; a JSON array file (JSON, not JSON
lines) was `missing chosen rejected (line is a JSON list ...)`. Now each reader names another format's lines for what
they are and says once which --format reads them (minilmd/corpus/sources/line_shape.py), a BOM at the very start of
a file is taken (only there), and a file that is one JSON array is said to be one, with the `jq` line that converts
it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from chat_helpers import a, u
from minilmd.corpus.chat import check_conversation
from minilmd.corpus.format import open_prepared
from minilmd.corpus.prepare.dpo_encode import check_pair
from minilmd.corpus.prepare.pipeline import prepare
from minilmd.corpus.sources.jsonl import (
    CHAT_ADVICE,
    DPO_ADVICE,
    TEXT_ADVICE,
    InputError,
    Source,
    json_document,
    parse_block,
)
from minilmd.corpus.sources.train_texts import iter_texts

BOM = "\ufeff"
TEXT = {"text": "今天的天气很好，我们出去走走。"}
CHAT = {"conversations": [u("你好"), a("你好，有什么事？")]}
PAIR = {"chosen": [u("一加一是几？"), a("二。")], "rejected": [u("一加一是几？"), a("三。")]}
LINE = {"text": TEXT, "chat": CHAT, "dpo": PAIR}
ADVICE = {"text": TEXT_ADVICE, "chat": CHAT_ADVICE, "dpo": DPO_ADVICE}


def _lines(fmt: str, n: int) -> list[dict]:
    """n distinct lines of the format (distinct: the leak check would drop repeats)."""
    out = []
    for i in range(n):
        line = json.loads(json.dumps(LINE[fmt], ensure_ascii=False))
        if fmt == "text":
            line["text"] += f" 第{i}天。"
        else:
            for conv in line.get("conversations", []), line.get("chosen", []), line.get("rejected", []):
                if conv:
                    conv[-1]["content"] += f" ({i})"
        out.append(line)
    return out


def _write(path: Path, lines: list[dict], head: str = "") -> Path:
    path.write_text(head + "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    return path


def _prepare(fmt: str, sources: list[Path], out: Path, tokenizer: Path, chat_tokenizer: Path, **kw) -> dict:
    tok = tokenizer if fmt == "text" else chat_tokenizer
    kw = {"workers": 0, "val_fraction": 0.0, "seq_len": 256, "log": lambda _: None, "progress": False, **kw}
    return prepare([str(p) for p in sources], tok, out, data_format=fmt, **kw)


def test_each_reader_names_the_lines_of_another_format_for_what_they_are():
    assert check_pair(CHAT)[1] == ("chat_line", '"chosen" and "rejected" expected, found "conversations": chat data')
    assert check_pair(TEXT)[1] == ("text_line", '"chosen" and "rejected" expected, found "text": text data')
    assert check_conversation(PAIR)[1] == ("dpo_line", 'a "conversations" (or "messages") key expected, found '
                                                       '"chosen" and "rejected": a preference pair')
    assert check_conversation(TEXT)[1][0] == "text_line"
    assert parse_block(json.dumps(PAIR).encode() + b"\n", 1).bad == [
        (1, "dpo_line", 'a "text" key expected, found "chosen" and "rejected": a preference pair')]
    assert check_pair({"chosen": []})[1][0] == "missing_chosen_rejected"  # half a pair: no other format's line
    assert check_conversation({"messages": []})[1][0] == "empty_conversation"  # "messages": the list's other name


@pytest.mark.parametrize("given, fmt", [("chat", "dpo"), ("dpo", "chat"), ("dpo", "text"), ("text", "dpo")])
def test_a_corpus_given_with_the_wrong_format_says_once_which_format_reads_it(tmp_path, tokenizer, chat_tokenizer,
                                                                            given, fmt):
    src = _write(tmp_path / "in.jsonl", _lines(given, 30))
    with pytest.raises(InputError) as e:
        _prepare(fmt, [src], tmp_path / "out", tokenizer, chat_tokenizer)
    said = str(e.value)
    assert said.count(ADVICE[given]) == 1 and f"--format {given}" in ADVICE[given], said
    assert f"30 bad lines ({given} line: 30)" in said, said


def test_an_append_of_pairs_to_a_text_corpus_says_to_prepare_a_corpus_of_their_own(tmp_path, tokenizer):
    from minilmd.corpus.prepare.append import append

    root = tmp_path / "prepared"
    _prepare("text", [_write(tmp_path / "t.jsonl", _lines("text", 40))], root, tokenizer, None)
    with pytest.raises(InputError) as e:
        append([str(_write(tmp_path / "p.jsonl", _lines("dpo", 30)))], root, workers=0, log=lambda _: None)
    assert f"{root} is a text corpus and this looks like preference pairs" in str(e.value)
    assert "prepare it into a corpus of its own with --format dpo" in str(e.value)


@pytest.mark.parametrize("fmt", ["text", "chat", "dpo"])
def test_a_byte_order_mark_at_the_start_of_a_file_is_taken_and_line_numbers_stay_right(tmp_path, tokenizer,
                                                                                     chat_tokenizer, fmt):
    lines = _lines(fmt, 6)
    lines[3] = {"nothing": 1}  # line 4: bad, named by its number
    src = _write(tmp_path / "bom.jsonl", lines, head=BOM)
    meta = _prepare(fmt, [src], tmp_path / "out", tokenizer, chat_tokenizer, on_bad_line="skip")
    assert meta["sources"][0]["lines"] == 6 and meta["sources"][0]["bad_lines"] == 1, meta["sources"]
    assert [x.split(": ")[0] for x in meta["bad_lines"]["examples"]] == [f"{src}:4"]
    per_pair = 2 if fmt == "dpo" else 1
    assert open_prepared(tmp_path / "out").train.n_docs == 5 * per_pair  # line 1 among them


def test_a_byte_order_mark_anywhere_else_is_a_bad_line(tmp_path):
    src = _write(tmp_path / "two.jsonl", [TEXT], head=json.dumps({"text": "一"}) + "\n" + BOM)
    bad = []
    texts = list(_texts_of(src, bad))
    assert texts == ["一"] and bad == [(2, "invalid_json")], bad


def _texts_of(src: Path, bad: list, block_bytes: int = 1 << 20):
    s = Source(str(src))
    try:
        for first, blob in s.blocks(block_bytes):
            block = parse_block(blob, first)
            bad += [(line, reason) for line, reason, _ in block.bad]
            yield from block.texts
    finally:
        s.close()


def test_a_byte_order_mark_read_in_short_pieces_is_still_taken_and_tokenizer_train_takes_it(tmp_path):
    src = _write(tmp_path / "bom.jsonl", [{"text": "甲"}, {"text": "乙"}], head=BOM)
    bad: list = []
    assert list(_texts_of(src, bad, block_bytes=2)) == ["甲", "乙"] and not bad  # the BOM over two reads
    assert list(iter_texts([str(src)])) == ["甲", "乙"]


@pytest.mark.parametrize("indent", [None, 2], ids=["one line", "pretty-printed"])
@pytest.mark.parametrize("fmt", ["text", "dpo"])
def test_a_json_array_file_is_said_to_be_one_json_document_with_how_to_convert_it(tmp_path, tokenizer,
                                                                                chat_tokenizer, indent, fmt):
    src = tmp_path / "array.json"
    src.write_text(json.dumps(_lines(fmt, 3), ensure_ascii=False, indent=indent), encoding="utf-8")
    with pytest.raises(InputError) as e:
        _prepare(fmt, [src], tmp_path / "out", tokenizer, chat_tokenizer)
    said = str(e.value)
    assert f"{src} is one JSON document (an array), not JSON lines" in said, said
    assert f"jq -c '.[]' {src} > {tmp_path / 'array.jsonl'}" in said, said
    with pytest.raises(InputError) as e:  # tokenizer train: the same words
        list(iter_texts([str(src)]))
    assert f"{src} is one JSON document (an array), not JSON lines" in str(e.value)


def test_a_stray_array_line_in_json_lines_is_a_bad_line_not_a_json_document(tmp_path, tokenizer, chat_tokenizer):
    src = tmp_path / "lines.jsonl"
    src.write_text("[1, 2]\n" + "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in _lines("text", 20)),
                   encoding="utf-8")
    said: list[str] = []
    _prepare("text", [src], tmp_path / "out", tokenizer, chat_tokenizer, on_bad_line="skip", log=said.append)
    assert any(f"{src}:1: missing text" in line for line in said), said
    assert not any("JSON document" in line for line in said), said


def test_json_lines_whose_lines_are_arrays_of_strings_get_no_jq_advice(tmp_path, tokenizer, chat_tokenizer):
    """Found by a reviewer: any file beginning with "[" was said to be one JSON array, with `jq -c '.[]'`, which
    makes lines of bare strings of these: still bad lines. Line 1 is valid JSON, a list of no object: JSON lines."""
    src = tmp_path / "arrays.jsonl"
    src.write_text("".join(json.dumps(["hello", f"world {i}"]) + "\n" for i in range(20)), encoding="utf-8")
    with pytest.raises(InputError) as e:
        _prepare("text", [src], tmp_path / "out", tokenizer, chat_tokenizer)
    assert "20 bad lines" in str(e.value) and "JSON document" not in str(e.value), str(e.value)
    with pytest.raises(InputError) as e:
        list(iter_texts([str(src)]))
    assert "JSON document" not in str(e.value) and "jq" not in str(e.value), str(e.value)


def test_json_lines_whose_lines_are_message_lists_get_no_jq_advice(tmp_path, tokenizer, chat_tokenizer):
    """Found by a reviewer (review 7 #2): chat data written a message list a line (`[{"role": ..}, {"role": ..}]`)
    was said to be one JSON document, with `jq -c '.[]'`, which would split every conversation into lone messages:
    still bad lines. Lines 1 and 2 are each JSON by themselves: JSON lines."""
    src = tmp_path / "msgs.jsonl"
    src.write_text("".join(json.dumps(line["conversations"], ensure_ascii=False) + "\n" for line in _lines("chat", 20)),
                   encoding="utf-8")
    with pytest.raises(InputError) as e:
        _prepare("chat", [src], tmp_path / "out", tokenizer, chat_tokenizer)
    assert "20 bad lines" in str(e.value) and "JSON document" not in str(e.value), str(e.value)
    with pytest.raises(InputError) as e:
        list(iter_texts([str(src)]))
    assert "JSON document" not in str(e.value) and "jq" not in str(e.value), str(e.value)
    one = tmp_path / "one.json"  # the same records on one line, alone: one document still
    one.write_text(json.dumps(_lines("text", 3), ensure_ascii=False) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as e:
        list(iter_texts([str(one)]))
    assert f"{one} is one JSON document (an array), not JSON lines" in str(e.value), str(e.value)


@pytest.mark.parametrize("first, whole, one_document", [
    (b"[", True, True),  # a pretty-printed array
    (b'[{"text": "a"},', True, True),  # one object a line
    (b'[{"text": "a"}, {"text": "b"}]', True, True),  # the whole array on one line
    (b'["hello", "world 1"]', True, False),  # JSON lines whose lines are arrays of strings
    (b"[1, 2]", True, False),
    (b"[]", True, False),
    (b'{"text": "a"}', True, False),
    (b'[ {"text": "a very long', False, True),  # a line longer than a block: its first element
    (b'["a very long', False, False),
])
def test_a_file_is_one_json_document_of_records_by_its_first_line(first, whole, one_document):
    assert json_document(first, whole) is one_document


MESSAGES = b'[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]'


@pytest.mark.parametrize("first, second, one_document", [
    ((MESSAGES, True), (MESSAGES, True), False),  # a message list a line: JSON lines
    ((MESSAGES, True), (b'[{"role": "user", "content": "a very long', False), False),
    ((MESSAGES, True), None, True),  # the whole array on its only line
    ((b'[{"text": "a very long', False), (MESSAGES, True), False),
    ((b'[{"text": "a very long', False), (b'{"text": "b"},', True), True),  # a document, an object a line
    ((b'[{"text": "a very long', False), (b'{"text": "a very long', False), True),
    ((b'[{"text": "a"},', True), (b'{"text": "b"}', True), True),  # its first line is not JSON by itself
    ((b"[", True), (b'{"text": "b"}', True), True),
])
def test_the_second_line_tells_json_lines_from_a_document_on_one_line(first, second, one_document):
    assert json_document(*first, second) is one_document


@pytest.mark.parametrize("lines, one_document", [
    (['\n', '[{"text": "a"}, {"text": "b"}', "]"], True),
    (['["a", "b"]', '["c", "d"]'], False),
    ([json.dumps([{"text": "x" * 100}] * 3)], True),
    ([json.dumps(["x" * 100] * 3)], False),
    ([json.dumps([{"role": "user", "content": "x" * 40}] * 2)] * 2, False),  # a message list a line
])
def test_the_first_line_is_judged_in_short_blocks_and_when_longer_than_one(tmp_path, lines, one_document):
    src = tmp_path / "in.json"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for block_bytes in (2, 16, 1 << 20):  # blank lines alone in the first blocks; a line longer than a block
        s = Source(str(src))
        try:
            list(s.blocks(block_bytes))
        finally:
            s.close()
        assert s.json_array is one_document, block_bytes


def test_openai_style_messages_lines_are_prepared_as_chat(tmp_path, tokenizer, chat_tokenizer):
    """`prepare` of {"messages": [...]} lines said "use --format chat", and --format chat then refused each line
    `missing_conversations`, exit 65: "messages" is the list's other name (raw_corpus.CHAT_KEYS)."""
    lines = [{"messages": line["conversations"]} for line in _lines("chat", 5)]
    _prepare("chat", [_write(tmp_path / "in.jsonl", lines)], tmp_path / "out", tokenizer, chat_tokenizer)
    assert open_prepared(tmp_path / "out").train.n_docs == 5


def test_sharegpt_and_alpaca_lines_are_refused_naming_their_shape_and_the_conversion():
    sharegpt = {"conversations": [{"from": "human", "value": "你好"}, {"from": "gpt", "value": "你好！"}]}
    reason, detail = check_conversation(sharegpt)[1]
    assert detail.startswith("message 0 is ShareGPT-style ('from'/'value'): convert each message to "
                             '{"role": ..., "content": value}, "from" human -> "user", gpt -> "assistant"'), detail
    alpaca = {"instruction": "翻译", "input": "hello", "output": "你好"}
    reason, detail = check_conversation(alpaca)[1]
    assert reason == "missing_conversations" and detail.startswith(
        "line is Alpaca-style ('instruction'/'output'): convert each line to {\"conversations\": [{\"role\": "
        "\"user\", \"content\": instruction"), detail
