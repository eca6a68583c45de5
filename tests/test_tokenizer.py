"""Tokenizer training and the load-time check of MiniMind's special ids ([A], issue 2)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from data_helpers import MINIMIND_TOKENIZER, small_tokenizer, write_jsonl
from minilmd.corpus.tokenizer_train import TokenizerError, check_tokenizer, load_tokenizer, train_tokenizer


@pytest.fixture(scope="module")
def trained(demo_jsonl, tmp_path_factory):
    return small_tokenizer(demo_jsonl, tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab_size=400)


def test_trained_tokenizer_has_minimind_special_ids_and_round_trips(trained):
    tok = load_tokenizer(trained)
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert tok.get_vocab_size() == 400
    for text in ["这本书写得很好，推荐！", "Mixed 中文 and English, 123 ✓", "  leading spaces\nand lines"]:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert min(ids) > 2, "plain text must never encode to PAD/BOS/EOS"
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_load_accepts_a_directory_holding_tokenizer_json(trained):
    assert load_tokenizer(trained.parent).token_to_id("<|im_end|>") == 2


def _tokenizer_with_specials(specials: list[str], extra_vocab: int = 0):
    from tokenizers import Tokenizer, models

    vocab = {tok: i for i, tok in enumerate(specials)}
    for i in range(extra_vocab):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=specials[0]))
    tok.add_special_tokens(specials)
    return tok


@pytest.mark.parametrize("specials, expected", [
    (["<|im_start|>", "<|endoftext|>", "<|im_end|>"], "'<|im_start|>' has id 0, minilmd needs id 1"),
    (["<|endoftext|>", "<|im_end|>", "<|im_start|>"], "'<|im_end|>' has id 1, minilmd needs id 2"),
    (["<|endoftext|>", "<|im_start|>", "<eos>"], "'<|im_end|>' is missing (minilmd needs it as id 2)"),
])
def test_load_refuses_other_special_ids_naming_the_mismatch(tmp_path, specials, expected):
    path = tmp_path / "tokenizer.json"
    _tokenizer_with_specials(specials, 10).save(str(path))
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(path)
    assert expected in str(e.value)
    assert str(path) in str(e.value)


def test_load_refuses_a_vocabulary_that_does_not_fit_uint16(tmp_path):
    path = tmp_path / "tokenizer.json"
    _tokenizer_with_specials(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 65536).save(str(path))
    with pytest.raises(TokenizerError, match=r"vocabulary has 65539 entries.*< 65536"):
        load_tokenizer(path)


def test_load_refuses_missing_and_malformed_files(tmp_path):
    with pytest.raises(TokenizerError, match="no such tokenizer file"):
        load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="not a valid tokenizer.json"):
        load_tokenizer(bad)


def test_train_refuses_a_vocab_size_without_room_for_bytes_and_specials():
    with pytest.raises(TokenizerError, match="at least 259"):
        train_tokenizer(["abc"], vocab_size=200)


@pytest.mark.skipif(not MINIMIND_TOKENIZER.is_file(),
                    reason=f"MiniMind's tokenizer is not present at {MINIMIND_TOKENIZER} (no ../shared)")
def test_minimind_tokenizer_is_accepted():
    tok = load_tokenizer(MINIMIND_TOKENIZER)
    check_tokenizer(tok)
    assert tok.get_vocab_size() == 6400
    ids = tok.encode("如何才能摆脱拖延症？", add_special_tokens=False).ids
    assert tok.decode(ids) == "如何才能摆脱拖延症？"


@pytest.mark.slow
def test_cli_tokenizer_train_and_bad_line_exit_status(tmp_path, demo_jsonl):
    out = tmp_path / "tok.json"
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "tokenizer", "train", *demo_jsonl,
                           "--vocab-size", "300", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"wrote {out}: vocabulary of 300\n"  # no empty progress-bar lines when piped (issue 24)
    assert json.loads(out.read_text())["added_tokens"][2]["content"] == "<|im_end|>"
    assert load_tokenizer(out).get_vocab_size() == 300

    bad = write_jsonl(tmp_path / "bad.jsonl", ["fine"])
    with open(bad, "a", encoding="utf-8") as f:
        f.write('{"text": 5}\n')
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "tokenizer", "train", str(bad),
                           "--vocab-size", "300", "--out", str(tmp_path / "t2.json")], capture_output=True, text=True)
    assert done.returncode == 65
    assert f"{bad}:2: text not string" in done.stderr
    assert not (tmp_path / "t2.json").exists()


def test_cli_tokenizer_train_max_docs_reads_only_the_first_documents(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", ["ab" * 50] + [f"其他文字 {i} xyz" for i in range(50)])
    out = tmp_path / "tok.json"
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "tokenizer", "train", str(src),
                           "--vocab-size", "300", "--max-docs", "1", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    merges = json.loads(out.read_text())["model"]["merges"]
    assert merges, "some merges were learned"
    assert all(set("".join(m if isinstance(m, str) else "".join(m))) <= set("ab ") for m in merges)


@pytest.mark.slow  # three tokenizers trained and a chat corpus prepared: ~2 s
def test_tokenizer_train_chat_template_makes_a_tokenizer_prepare_format_chat_takes(tmp_path, demo_jsonl):
    """issue 24: a tokenizer from `tokenizer train` had no chat template, so `prepare --format chat` with it failed."""
    from typer.testing import CliRunner

    from chat_helpers import HAND_MADE, write_chat_jsonl
    from minilmd.cli import app
    from minilmd.corpus.chat_files import load_template
    from minilmd.corpus.chat_templates import MINIMIND_TEMPLATE

    runner = CliRunner()
    tok = tmp_path / "tok" / "tokenizer.json"
    train = ["tokenizer", "train", *demo_jsonl, "--vocab-size", "300", "--max-docs", "300"]
    done = runner.invoke(app, [*train, "--out", str(tok), "--chat-template", "minimind"])
    assert done.exit_code == 0, done.output
    assert f"wrote {tok.with_name('tokenizer_config.json')}: chat template minimind" in done.output
    assert json.loads(tok.with_name("tokenizer_config.json").read_text())["chat_template"] == MINIMIND_TEMPLATE
    conversations = write_chat_jsonl(tmp_path / "chat.jsonl", HAND_MADE * 30)
    prepared = runner.invoke(app, ["prepare", str(conversations), "--tokenizer", str(tok), "--format", "chat",
                                   "--out", str(tmp_path / "corpus"), "--workers", "0", "--val-fraction", "0.3"])
    assert prepared.exit_code == 0, prepared.output
    assert load_template(tmp_path / "corpus").render([{"role": "user", "content": "q"}], True) == \
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"

    # your own: a Jinja file, or a tokenizer_config.json whose chat_template is taken
    own = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    (tmp_path / "own.jinja").write_text(own)
    (tmp_path / "their_config.json").write_text(json.dumps({"chat_template": own, "bos_token": "<s>"}))
    for given in ("own.jinja", "their_config.json"):
        out = tmp_path / given.split(".")[0] / "tokenizer.json"
        done = runner.invoke(app, [*train, "--out", str(out), "--chat-template", str(tmp_path / given)])
        assert done.exit_code == 0, done.output
        assert json.loads(out.with_name("tokenizer_config.json").read_text())["chat_template"] == own


def test_tokenizer_train_refuses_a_chat_template_that_does_not_load_before_it_trains(tmp_path, demo_jsonl):
    from typer.testing import CliRunner

    from minilmd.cli import app

    (tmp_path / "broken.jinja").write_text("{{ broken")
    (tmp_path / "no_template.json").write_text('{"bos_token": "<s>"}')
    for given in (str(tmp_path / "broken.jinja"), str(tmp_path / "no_template.json"), "chatml-of-nowhere"):
        refused = CliRunner().invoke(app, ["tokenizer", "train", *demo_jsonl, "--out", str(tmp_path / "no" / "t.json"),
                                           "--chat-template", given])
        assert refused.exit_code == 2 and f"--chat-template {given}:" in refused.output, refused.output
        assert not (tmp_path / "no").exists()  # exit 2 before any training: nothing written


MINIMIND_CONFIG = MINIMIND_TOKENIZER.parent / "tokenizer_config.json"


@pytest.mark.skipif(not MINIMIND_CONFIG.is_file(), reason=f"MiniMind's tokenizer_config.json is not at "
                                                             f"{MINIMIND_CONFIG} (no ../shared)")
def test_the_minimind_template_renders_what_minimind_s_own_renders():
    from chat_helpers import HAND_MADE, tool_conversations
    from minilmd.corpus.chat import ChatTemplate
    from minilmd.corpus.chat_templates import MINIMIND_TEMPLATE, tokenizer_config

    theirs = ChatTemplate.from_config(json.loads(MINIMIND_CONFIG.read_text(encoding="utf-8")))
    ours = ChatTemplate.from_config(tokenizer_config(MINIMIND_TEMPLATE))
    for conversation in HAND_MADE + tool_conversations():  # MiniMind's tool calls included (chat_tools.py)
        for prompt in (False, True):
            assert ours.render(conversation, prompt) == theirs.render(conversation, prompt), conversation
        assert ours.targets(conversation) == theirs.targets(conversation)
