"""`minilmd prepare --out NAME` with a NAME the file system takes but not the temporary names prepare makes beside
it (`.NAME.prepare-HOST-PID-TICKS.RANDOM.old`, some 40 bytes longer; `.NAME.append.prepare-...` for an append):
refused up front (exit 2) with the limit and the name's length, nothing made, instead of an ENAMETOOLONG traceback."""
from __future__ import annotations

import os
import socket

import pytest
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.corpus.prepare.pipeline import prepare


def _name_max(path) -> int:
    return os.pathconf(path, "PC_NAME_MAX")


@pytest.mark.parametrize("length", ["fits the file system", "too long even for it"])
def test_an_out_name_too_long_for_prepares_temporary_names_is_refused_with_its_limit(tmp_path, demo_jsonl,
                                                                                     tokenizer, length):
    """Before: an OSError traceback (ENAMETOOLONG) from the temporary directory's mkdir (after the lock file
    `NAME.lock` was made), or from the first look at --out itself for a name past the file system's limit."""
    name_max = _name_max(tmp_path)
    n = name_max - 20 if length == "fits the file system" else name_max + 5
    out = tmp_path / "sub" / ("c" * n)
    result = CliRunner().invoke(app, ["prepare", demo_jsonl[0], "--tokenizer", str(tokenizer), "--out", str(out),
                                      "--workers", "0", "--val-fraction", "0.1"])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    text = " ".join(result.output.split())
    assert f"its name is {n} bytes" in text, text
    assert f"at most {name_max} bytes a name" in text and "nothing was made" in text, text
    assert ".prepare-" in text and socket.gethostname() in text, text
    assert os.listdir(tmp_path) == []  # not even --out's parent: nothing made


def test_an_append_to_a_corpus_whose_name_leaves_no_room_for_its_temporary_name_is_refused(tmp_path, demo_jsonl,
                                                                                          tokenizer):
    """A corpus renamed to a name 10 bytes short of the limit: its append's `.NAME.append.prepare-HOST-PID-TICKS`
    cannot be made. Before: `NAME.lock` made, then an ENAMETOOLONG traceback. Now exit 2 up front, nothing made,
    the corpus unchanged."""
    name_max = _name_max(tmp_path)
    short = tmp_path / "c"
    prepare([demo_jsonl[0]], tokenizer, short, val_fraction=0.1, workers=0, progress=False, log=lambda m: None)
    root = tmp_path / ("c" * (name_max - 10))
    short.rename(root)
    before = sorted(os.listdir(tmp_path))
    meta = (root / "meta.json").read_bytes()
    result = CliRunner().invoke(app, ["prepare", "--append", demo_jsonl[1], "--out", str(root), "--workers", "0"])
    assert result.exit_code == 2, (result.output, result.exception)
    text = " ".join(result.output.split())
    assert f"its name is {name_max - 10} bytes" in text and f"at most {name_max} bytes a name" in text, text
    assert ".NAME.append.prepare-" in text and "nothing was made" in text, text
    assert sorted(os.listdir(tmp_path)) == before and (root / "meta.json").read_bytes() == meta
