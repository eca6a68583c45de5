"""`minilmd tokenizer template`: an existing tokenizer given a chat template, its vocabulary unchanged (found by a
new user: `prepare --format chat` with a tokenizer that had none said `error: .: no chat template` and offered
only `tokenizer train --chat-template`, which trains another vocabulary: a model pretrained with the first could
not be fine-tuned). The refusal now names the tokenizer as given and this command; the command writes the
tokenizer_config.json beside the tokenizer (or the tokenizer.json, byte for byte, and it at --out)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chat_helpers import HAND_MADE, write_chat_jsonl
from minilmd.corpus.chat_files import load_template
from minilmd.corpus.chat_templates import MINIMIND_TEMPLATE
from minilmd.corpus.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow  # real commands in subprocesses

SAMPLE = "今天天气很好，我们去公园散步。 The weather is fine; 1998年的人民日报。"


def minilmd(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.fixture
def bare(tmp_path, tokenizer) -> Path:
    """A copy of the session's tokenizer.json, alone in its directory: no chat template."""
    shutil.copyfile(tokenizer, tmp_path / "tokenizer.json")
    return tmp_path / "tokenizer.json"


def prepare_chat(tmp_path: Path, tok: str, out: str) -> subprocess.CompletedProcess:
    chat = write_chat_jsonl(tmp_path / "chat.jsonl", HAND_MADE * 30)
    return minilmd("prepare", str(chat), "--format", "chat", "--tokenizer", tok, "--out", out, "--workers", "0",
                   "--val-fraction", "0.3", cwd=tmp_path)


def test_prepare_chat_names_the_tokenizer_without_a_template_and_the_command_that_keeps_its_vocabulary(tmp_path,
                                                                                                     bare):
    refused = prepare_chat(tmp_path, "tokenizer.json", "sft")  # relative, as the user typed it: was named `.`
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("error: tokenizer.json: no chat template"), refused.stderr
    assert "`minilmd tokenizer template tokenizer.json --chat-template minimind`" in refused.stderr
    assert "vocabulary unchanged" in refused.stderr and not (tmp_path / "sft").exists()


def test_template_in_place_writes_only_the_config_and_the_ids_stay_the_same(tmp_path, bare):
    before_bytes, before_ids = bare.read_bytes(), load_tokenizer(bare).encode(SAMPLE).ids
    done = minilmd("tokenizer", "template", "tokenizer.json", "--chat-template", "minimind", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "wrote tokenizer_config.json: chat template minimind" in done.stdout
    assert bare.read_bytes() == before_bytes and load_tokenizer(tmp_path).encode(SAMPLE).ids == before_ids
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == MINIMIND_TEMPLATE
    prepared = prepare_chat(tmp_path, "tokenizer.json", "sft")
    assert prepared.returncode == 0, prepared.stderr
    assert load_tokenizer(tmp_path / "sft").encode(SAMPLE).ids == before_ids  # the corpus's copy: the same ids
    assert load_template(tmp_path / "sft").render([{"role": "user", "content": "q"}], True) == \
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_template_to_out_copies_the_tokenizer_byte_for_byte(tmp_path, bare):
    before_ids = load_tokenizer(bare).encode(SAMPLE).ids
    out = tmp_path / "chat-tok" / "tokenizer.json"
    done = minilmd("tokenizer", "template", str(tmp_path), "--chat-template", "minimind", "--out", str(out),
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == bare.read_bytes() and load_tokenizer(out).encode(SAMPLE).ids == before_ids
    assert sorted(p.name for p in out.parent.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert not (tmp_path / "tokenizer_config.json").exists()  # the source left as it was
    done = minilmd("tokenizer", "template", "tokenizer.json", "--chat-template", "minimind", "--out", "tok-chat",
                   cwd=tmp_path)  # a directory named: the tokenizer.json in it, never a file named tok-chat
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tok-chat" / "tokenizer.json").read_bytes() == bare.read_bytes()
    assert (tmp_path / "tok-chat" / "tokenizer_config.json").is_file()


def test_an_existing_config_is_kept_without_force_and_a_tokenizer_minilmd_cannot_use_is_refused(tmp_path, bare):
    config = tmp_path / "tokenizer_config.json"
    config.write_text('{"model_max_length": 512}', encoding="utf-8")
    refused = minilmd("tokenizer", "template", str(bare), "--chat-template", "minimind", cwd=tmp_path)
    assert refused.returncode == 2 and "pass --force" in refused.stderr, refused.stderr
    assert config.read_text(encoding="utf-8") == '{"model_max_length": 512}'
    forced = minilmd("tokenizer", "template", str(bare), "--chat-template", "minimind", "--force", cwd=tmp_path)
    assert forced.returncode == 0 and json.loads(config.read_text())["chat_template"] == MINIMIND_TEMPLATE

    (tmp_path / "other").mkdir()  # BOS renamed: not MiniMind's special ids
    (tmp_path / "other" / "tokenizer.json").write_text(bare.read_text(encoding="utf-8").replace(
        "<|im_start|>", "<|im_begin|>"), encoding="utf-8")
    refused = minilmd("tokenizer", "template", "other", "--chat-template", "minimind", cwd=tmp_path)
    assert refused.returncode == 2 and "not usable by minilmd" in refused.stderr, refused.stderr
    assert not (tmp_path / "other" / "tokenizer_config.json").exists()


def test_prepare_dpo_names_the_format_given_for_a_tokenizer_without_a_template(tmp_path, bare):
    pair = {"chosen": [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！"}],
            "rejected": [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "走开"}]}
    (tmp_path / "pairs.jsonl").write_text((json.dumps(pair, ensure_ascii=False) + "\n") * 20, encoding="utf-8")
    refused = minilmd("prepare", "pairs.jsonl", "--format", "dpo", "--tokenizer", "tokenizer.json", "--out", "dpo",
                      "--workers", "0", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "no chat template" in refused.stderr and "--format dpo renders conversations" in refused.stderr, \
        refused.stderr
    assert "--format chat" not in refused.stderr and not (tmp_path / "dpo").exists()
