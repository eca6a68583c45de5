"""One rule for every command that writes an --out (minilmd/fsio.py `out_taken`): something already there is
refused, exit 2, nothing changed, unless --force. `prepare` had it; `tokenizer train` (its tokenizer.json, and the
tokenizer_config.json beside it with --chat-template) and `export --format minimind` (its .pth) silently replaced
what was there, exit 0."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from data_helpers import write_jsonl
from minilmd.cli import app
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer

KEPT = b"the user's earlier file\n"


def test_tokenizer_train_refuses_an_existing_out_and_the_config_beside_it_unless_forced(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [f"some words {i} and more text" for i in range(60)])
    tok = tmp_path / "tk" / "tok.json"
    tok.parent.mkdir()
    beside = tok.with_name("tokenizer_config.json")
    train = ["tokenizer", "train", str(corpus), "--vocab-size", "300", "--out", str(tok)]
    for there in (tok, beside):  # each alone is refused: --chat-template would replace the config beside --out
        tok.unlink(missing_ok=True)
        there.write_bytes(KEPT)
        done = CliRunner().invoke(app, [*train, "--chat-template", "minimind"])
        assert done.exit_code == 2, done.output
        assert f"{there} already exists; pass --force to replace it" in done.output, done.output
        assert there.read_bytes() == KEPT
    tok.write_bytes(KEPT)
    done = CliRunner().invoke(app, [*train, "--chat-template", "minimind", "--force"])
    assert done.exit_code == 0, done.output
    assert tok.read_bytes() != KEPT and beside.read_bytes() != KEPT


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    place = tmp_path_factory.mktemp("ckpt")
    return save_checkpoint(place / "ckpt", tiny_model(), step=1, tokenizer=train_tokenizer(place / "tokenizer.json"))


def test_export_minimind_refuses_an_existing_pth_unless_forced(checkpoint, tmp_path):
    pth = tmp_path / "sft.pth"
    pth.write_bytes(KEPT)
    export = ["export", str(checkpoint), "--format", "minimind", "--out", str(pth)]
    done = CliRunner().invoke(app, export)
    assert done.exit_code == 2, done.output
    assert f"{pth} already exists; pass --force to replace it; nothing was written" in done.output, done.output
    assert pth.read_bytes() == KEPT
    done = CliRunner().invoke(app, [*export, "--force"])
    assert done.exit_code == 0, done.output
    assert pth.read_bytes() != KEPT


def test_export_minimind_into_a_directory_says_at_once_that_out_names_the_pth(checkpoint, tmp_path):
    """Before: `exp already exists; pass --force to replace it`, then with --force `Is a directory`."""
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "mine.txt").write_bytes(KEPT)
    for out, force in ((f"{exp}/", []), (str(exp), ["--force"]), (f"{tmp_path}/new/", [])):
        done = CliRunner().invoke(app, ["export", str(checkpoint), "--format", "minimind", "--out", out, *force])
        assert done.exit_code == 2, done.output
        assert f"--out {out} is a directory: --format minimind writes one file, the .pth, and --out names that " \
               f"file (e.g. --out {Path(out) / 'model.pth'}); nothing was written" in done.output, done.output
        assert "already exists" not in done.output and "pass --force" not in done.output, done.output
    assert [p.name for p in exp.iterdir()] == ["mine.txt"] and not (tmp_path / "new").exists()


def test_export_hf_refuses_a_directory_that_is_not_empty_exit_2(checkpoint, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "mine.txt").write_bytes(KEPT)
    done = CliRunner().invoke(app, ["export", str(checkpoint), "--format", "hf", "--out", str(out)])
    assert done.exit_code == 2, done.output  # an --out it must not write, as the export's help says (was 1)
    assert "exists and is not an empty directory" in done.output and (out / "mine.txt").read_bytes() == KEPT
