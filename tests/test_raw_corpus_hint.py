"""A raw corpus given as data.prepared (user6 #11: `not a directory (a regular file); not an output of minilmd
prepare`, and no more) is told the prepare command to run, its --format from the file's first line as prepare's
readers tell formats apart (minilmd/raw_corpus.py); a .txt or .parquet is told to become JSON lines first. The
file is read as untrusted: no link followed, no FIFO opened."""
from __future__ import annotations

import json
import os
import subprocess

from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.raw_corpus import prepare_hint

CHAT = {"conversations": [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！"}]}


def test_a_jsonl_is_told_the_prepare_command_with_the_format_its_first_line_is_of(tmp_path):
    for name, line, fmt in [("sft.jsonl", CHAT, "chat"), ("pairs.jsonl", {"chosen": [], "rejected": []}, "dpo"),
                            ("pt.jsonl", {"text": "人民日报"}, "text")]:
        (tmp_path / name).write_text("\n" + json.dumps(line, ensure_ascii=False) + "\n", encoding="utf-8")
        stem = tmp_path / name.removesuffix(".jsonl")
        assert prepare_hint(str(tmp_path / name), 512) == (
            f"a raw corpus: run `minilmd prepare {tmp_path / name} --format {fmt} --tokenizer TOKENIZER --seq-len 512 "
            f"--out {stem}-prepared`, then set data.prepared = '{stem}-prepared'")


def test_what_cannot_be_told_is_prepared_as_text_with_the_other_formats_named(tmp_path):
    (tmp_path / "sft.jsonl").write_text(json.dumps(CHAT) + "\n", encoding="utf-8")
    os.symlink(tmp_path / "sft.jsonl", tmp_path / "link.jsonl")  # never followed
    os.mkfifo(tmp_path / "fifo.jsonl")  # never opened: this would block
    (tmp_path / "big.jsonl").write_text("x" * (1 << 21), encoding="utf-8")  # no whole line in the part read
    for name in ("link.jsonl", "fifo.jsonl", "big.jsonl", "sft.jsonl.gz"):
        hint = prepare_hint(str(tmp_path / name), 340)
        assert "--format text --tokenizer" in hint and "(--format chat for conversations, dpo for preference " \
            "pairs)" in hint, hint


def test_a_text_or_parquet_file_is_told_to_become_json_lines_first(tmp_path):
    txt = prepare_hint(str(tmp_path / "news.txt"), 340)
    assert txt.startswith(f"a text file is a raw corpus: prepare reads JSON lines, so make each document a "
                          f"{{\"text\": ...}} line (`jq -R -c '{{text: .}}' {tmp_path}/news.txt > "
                          f"{tmp_path}/news.jsonl`"), txt
    assert f"`minilmd prepare {tmp_path}/news.jsonl --format text --tokenizer" in txt, txt
    parquet = prepare_hint(str(tmp_path / "sft.parquet"), 340)
    assert _python_code(parquet) == (f"import pandas as pd; pd.read_parquet('{tmp_path}/sft.parquet').to_json("
                                     f"'{tmp_path}/sft.jsonl', orient='records', lines=True, force_ascii=False)")
    assert f"`minilmd prepare {tmp_path}/sft.jsonl --format text" in parquet, parquet
    assert prepare_hint(str(tmp_path / "corpus.bin"), 340) == ""


def _python_code(hint: str) -> str:
    """The Python code the hint's `python -c ...` hands python, as a shell reads the command pasted (review 8:
    the path went into the shell's double quotes, so `$(...)` in it ran)."""
    command = hint.split("`")[1]
    assert command.startswith("python -c "), hint
    shown = subprocess.run(["bash", "-c", "printf %s " + command.removeprefix("python -c ")], capture_output=True,
                           text=True, check=True)
    return shown.stdout


def test_a_hostile_parquet_path_is_python_data_never_shell_code(tmp_path):
    marker = tmp_path / "pwned"
    path = f"{tmp_path}/$(touch {marker})'\"x.parquet"
    code = _python_code(prepare_hint(path, 340))
    assert not marker.exists()
    assert code.startswith(f"import pandas as pd; pd.read_parquet({path!r})"), code


def test_a_prepared_corpus_named_by_its_meta_json_is_told_its_directory(tmp_path):
    assert prepare_hint(str(tmp_path / "corpus" / "meta.json"), 340) == (
        f"data.prepared names a prepared corpus's directory, not its meta.json: set data.prepared = "
        f"'{tmp_path / 'corpus'}'")


def _check_prepared(tmp_path, prepared) -> tuple[int, str]:
    """`run --check` of a config whose data.prepared is `prepared`: (its exit code, its output on one line)."""
    config = tmp_path / "c.toml"
    config.write_text(f'[run]\nname = "c"\ndir = "{tmp_path / "run"}"\n[data]\nprepared = "{prepared}"\n'
                      f'[train]\nmax_steps = 10\nseq_len = 256\n', encoding="utf-8")
    result = CliRunner().invoke(app, ["run", "--check", str(config)])
    return result.exit_code, " ".join(result.output.split())


def test_run_check_says_the_command_to_run(tmp_path):
    raw = tmp_path / "sft.jsonl"
    raw.write_text(json.dumps(CHAT) + "\n", encoding="utf-8")
    code, said = _check_prepared(tmp_path, raw)
    assert code == 2 and (
        f"data.prepared = '{raw}': not a directory (a regular file); not an output of `minilmd prepare`; a raw "
        f"corpus: run `minilmd prepare {raw} --format chat --tokenizer TOKENIZER --seq-len 256 --out "
        f"{tmp_path}/sft-prepared`, then set data.prepared = '{tmp_path}/sft-prepared'") in said, said


def test_run_check_of_a_directory_of_raw_json_lines_says_the_command_to_run(tmp_path):
    """A new user's data.prepared naming the directory of his raw JSONL got only `no meta.json there; not an output
    of minilmd prepare`, where a single .jsonl got the command."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("a.jsonl", "b.jsonl", "c.jsonl.gz", "notes.md"):
        (raw / name).write_text(json.dumps({"text": "人民日报"}) + "\n", encoding="utf-8")
    code, said = _check_prepared(tmp_path, raw)
    assert code == 2 and (
        f"data.prepared = '{raw}': no meta.json there; not an output of `minilmd prepare`; it holds raw JSON lines: "
        f"`minilmd prepare {raw}/*.jsonl {raw}/*.jsonl.gz --tokenizer TOKENIZER --seq-len 256 --out "
        f"{raw}-prepared` (--format chat for conversations, dpo for preference pairs), then set data.prepared = "
        f"'{raw}-prepared'") in said, said
    for name in ("a.jsonl", "b.jsonl", "c.jsonl.gz"):
        (raw / name).unlink()
    (raw / "tokenizer.json").write_text("{}")  # a prepared corpus copied without its meta.json: no raw JSON lines
    said = _check_prepared(tmp_path, raw)[1]
    assert "no meta.json there; not an output of `minilmd prepare`" in said and "raw JSON lines" not in said, said


def test_run_check_of_a_directory_of_chat_files_names_their_format(tmp_path):
    """A new user's LoRA stage named the directory `minilmd demo-corpus --chat` wrote as data.prepared: the command
    said no --format, and pasted it read the conversations as text and refused every line (exit 65). The files'
    first lines tell the format, as they do for one file; files of several formats keep the general words."""
    raw = tmp_path / "chat"
    raw.mkdir()
    for name in ("chat_chinese.jsonl", "chat_english.jsonl"):
        (raw / name).write_text(json.dumps(CHAT, ensure_ascii=False) + "\n", encoding="utf-8")
    code, said = _check_prepared(tmp_path, raw)
    assert code == 2 and (
        f"it holds raw JSON lines: `minilmd prepare {raw}/*.jsonl --format chat --tokenizer TOKENIZER --seq-len 256 "
        f"--out {raw}-prepared`, then set data.prepared = '{raw}-prepared'") in said, said
    (raw / "pairs.jsonl").write_text(json.dumps({"chosen": [], "rejected": []}) + "\n", encoding="utf-8")
    said = _check_prepared(tmp_path, raw)[1]
    assert (f"`minilmd prepare {raw}/*.jsonl --tokenizer TOKENIZER --seq-len 256 --out {raw}-prepared` (--format chat "
            f"for conversations, dpo for preference pairs)") in said, said
