"""A prepared corpus copied short (a new user's `truncate` of train/tokens.bin) passed `run --check`; the launch
then staged it 20 times over a minute and gave up (exit 79). `--check` now says it as a wait, from a stat of each
file meta.json lists (minilmd/probes.py shorter_than_listed): not a refusal, since a share that shrank for a moment
is read again by staging, and a longer file is a `prepare --append` under way, read to its listed size."""
from __future__ import annotations

import os
import shutil

from supervisor_helpers import cli, write_config


def _check(tmp_path, corpus, prepared) -> str:
    config = write_config(tmp_path, (prepared, corpus[1]), remote=False)
    done = cli("run", "--check", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
    return " ".join((done.stdout + done.stderr).split())


def test_a_corpus_copied_short_is_said_at_check_and_a_longer_one_is_not(tmp_path, corpus):
    prepared = tmp_path / "copy"
    shutil.copytree(corpus[0], prepared)
    tokens = prepared / "train" / "tokens.bin"
    listed = tokens.stat().st_size
    assert "copy cut short" not in _check(tmp_path, corpus, prepared)
    os.truncate(tokens, listed - 100)
    said = _check(tmp_path, corpus, prepared)
    assert (f"waits: data.prepared = '{prepared}': train/tokens.bin holds {listed - 100:,} bytes, meta.json lists "
            f"{listed:,}: a copy cut short? staging copies it again and again, then gives up (exit 79): prepare it "
            f"again") in said, said
    os.truncate(tokens, listed + 100)  # an append's tail written, meta.json not yet: read to its listed size
    assert "copy cut short" not in _check(tmp_path, corpus, prepared)
    tokens.unlink()  # what the launch waits for (staging's "source unreachable"), never gives up on
    said = _check(tmp_path, corpus, prepared)
    assert "train/tokens.bin is missing: a copy cut short, or still under way? staging waits for it" in said, said
    assert "exit 79" not in said, said  # before: said to give up, while the launch waited (new user, stop 65)
