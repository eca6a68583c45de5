"""Padded JSON files cost seconds, not minutes (hostile audit 2): a meta.json or trainer_state.json padded to 63 MiB
within the old 64 MiB bounds took `corpus report` 226 s / 2.4 GB, `verify` 77 s; the depth scan was a Python step per
bracket (39 s of it), `run --check` parsed meta.json twice. Now the bounds fit the real files (2-35 KB; tokenizer.json
441 KiB for MiniMind), the depth scan takes a Python step per run of brackets only, and --check reads meta.json once."""
from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from minilmd import corpus_meta, names
from minilmd.corpus.tokenizer import TokenizerError, read_tokenizer_text
from minilmd.untrusted import too_deep


def _python_lines_in(fn, *args) -> tuple[object, int]:
    """fn(*args), and how many Python lines ran inside it (in its own frame): the work done a step at a time."""
    count = 0
    code = fn.__code__

    def tracer(frame, event, arg):
        nonlocal count
        if frame.f_code is code:
            if event == "line":
                count += 1
            return tracer
        return None

    sys.settrace(tracer)
    try:
        return fn(*args), count
    finally:
        sys.settrace(None)


def test_the_depth_scan_steps_per_run_of_brackets_not_per_bracket():
    flat = '{"a": [' + "{}," * 100_000 + '{}], "s": "[[[[{{{{"}'
    deep = "[" * 65 + "1" + "]" * 65
    towers = "[" + ",".join(["[" * 60 + "]" * 60] * 2000) + "]"
    for text, expected in ((flat, False), (deep, True), (towers, False), ("[" * 63 + '"' + "[" * 9, False),
                           ("[" * 70, True), ("[" + "[]" * 70 + "]", False)):
        said, steps = _python_lines_in(too_deep, text, 64)
        assert said is expected, text[:80]
        assert steps < 20 + len(text) // 10, (text[:80], steps)  # was a few steps a bracket: 1,000,000 for `flat`


def test_a_meta_json_padded_past_4_mib_is_refused(tmp_path):
    meta = {"format": corpus_meta.FORMAT, "junk": [{}] * ((5 << 20) // 4)}
    (tmp_path / names.CORPUS_META).write_text(json.dumps(meta))  # 5 MiB: read whole under the 64 MiB bound before
    with pytest.raises(corpus_meta.CorpusError, match=r"meta.json: unreadable \(over 4 MiB\)"):
        corpus_meta.read_meta(tmp_path)


def test_a_tokenizer_json_past_16_mib_is_refused_unparsed(tmp_path):
    path = tmp_path / "tokenizer.json"
    with open(path, "wb") as f:
        f.truncate(17 << 20)  # sparse: costs no disk
    with pytest.raises(TokenizerError, match="larger than 16 MiB"):
        read_tokenizer_text(path)


def test_run_check_parses_meta_json_once(tmp_path, corpus, monkeypatch):
    from minilmd.cli import app
    from supervisor_helpers import write_config

    parsed = []
    real = corpus_meta.loads_any
    monkeypatch.setattr(corpus_meta, "loads_any", lambda raw: parsed.append(len(raw)) or real(raw))
    result = CliRunner().invoke(app, ["run", "--check", str(write_config(tmp_path, corpus))])
    assert result.exit_code == 0, result.output
    assert len(parsed) <= 1, parsed  # five before; none when an earlier test parsed the same bytes


def test_corpus_report_ships_its_workers_the_meta_they_read_not_the_padding(tmp_path, corpus):
    import pickle
    import shutil

    from minilmd.corpus.analysis import scan

    padded = tmp_path / "padded"
    shutil.copytree(corpus[0], padded)
    meta = json.loads((padded / names.CORPUS_META).read_text())
    meta["junk"] = [{}] * 200_000  # 600 KB of it, within the bound
    (padded / names.CORPUS_META).write_text(json.dumps(meta))
    opened = scan.open_corpus(str(padded), parts=4)
    shipped = scan._for_workers(opened)  # what each shard's task is pickled with
    assert len(pickle.dumps(shipped.meta)) < 1024, shipped.meta  # the padding went to every shard before
    assert len(pickle.dumps(shipped)) < len(pickle.dumps(opened)) // 10
    assert shipped.meta["splits"]["train"]["documents"] == meta["splits"]["train"]["documents"]
