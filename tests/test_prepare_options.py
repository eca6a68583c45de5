"""prepare's options: one dataclass, every invalid option reported at once, before any input is read."""
import pytest

from minilmd.corpus.prepare.pipeline import PrepareOptions, prepare


def test_defaults_are_valid():
    assert PrepareOptions().problems() == []


def test_every_invalid_option_is_reported_at_once():
    problems = PrepareOptions(val_fraction=1.5, on_bad_line="ignore", seq_len=1).problems()
    assert [p.split(" ", 1)[0] for p in problems] == ["--on-bad-line", "--val-fraction", "--seq-len"]


def test_prepare_refuses_bad_options_before_opening_the_tokenizer_or_the_sources(tmp_path):
    with pytest.raises(ValueError, match=r"--val-fraction 2: .*; --seq-len 1 .*; no corpus files given"):
        prepare([], tmp_path / "no-such-tokenizer.json", tmp_path / "out", val_fraction=2, seq_len=1)
    assert list(tmp_path.iterdir()) == []
