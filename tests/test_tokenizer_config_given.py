"""A --tokenizer given as the tokenizer_config.json (or chat_template.jinja) beside a tokenizer.json, a natural slip
for a Hugging Face user, is said to be that file, with the tokenizer.json and the directory to give instead. Before
(user report 9, finding 10), `prepare --format chat` said the file had no chat template, though it held one, and
advised `minilmd tokenizer template .../tokenizer_config.json`, which failed; without --format chat it said only
"not a valid tokenizer.json"."""
from __future__ import annotations

import json
import shutil

import pytest

from supervisor_helpers import cli


@pytest.mark.parametrize("name", ["tokenizer_config.json", "chat_template.jinja"])
@pytest.mark.parametrize("data_format", ["chat", "text"])
def test_prepare_names_the_file_given_and_what_to_give(tmp_path, chat_tokenizer, chat_jsonl, name, data_format):
    tok = shutil.copytree(chat_tokenizer, tmp_path / "tok")
    template = json.loads((tok / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]
    (tok / "chat_template.jinja").write_text(template, encoding="utf-8")  # transformers' file of its own
    given = tok / name
    said = cli("prepare", str(chat_jsonl[0]), "--format", data_format, "--tokenizer", str(given),
               "--out", str(tmp_path / "out"))
    assert said.returncode == 2, said.stdout + said.stderr
    assert f"{given} is the {name} beside a tokenizer, not the tokenizer: give its tokenizer.json " \
        f"({tok / 'tokenizer.json'}) or its directory ({tok})" in said.stderr, said.stderr
    assert "no chat template" not in said.stderr and "tokenizer template" not in said.stderr
