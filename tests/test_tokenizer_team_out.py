"""`tokenizer train --out` in a team directory (mode 2770, a group other users are in), attacked by a group member:
he moves the victim's `tok` aside and puts a link to the victim's private directory in its place. The tokenizer
(and, with --chat-template, the tokenizer_config.json beside it) is written as an export's --out is: its directory
opened once under the place rule, the file written at that descriptor (minilmd/fsio.py write_out_text). Before,
the run made the directory by path and wrote through the link: the victim's private tokenizer.json replaced."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd.names import TOKENIZER_CONFIG
from second_user import as_user, group_dir, teammate  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow  # trains a tokenizer



def _train(corpus: list[str], out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", "tokenizer", "train", *corpus, "--vocab-size",
                           "300", "--out", str(out), *extra], capture_output=True, text=True, timeout=600)


def test_a_teammates_link_to_the_victims_directory_is_never_written_through(teammate, demo_jsonl, tmp_path):
    (uid, gid), where = teammate
    team = group_dir(where, gid, "grp")
    (team / "tok").mkdir()
    private = tmp_path / "private"  # the victim's: under pytest's root-only directory
    private.mkdir(mode=0o700)
    (private / "tokenizer.json").write_text("the victim's own tokenizer\n")
    moved = subprocess.run(as_user(["sh", "-c", f"mv {team}/tok {team}/tok.moved && ln -s {private} {team}/tok"]),
                           capture_output=True, text=True, timeout=60)
    assert moved.returncode == 0, moved.stderr
    assert (team / "tok").is_symlink() and os.lstat(team / "tok").st_uid == uid

    runs = [_train(demo_jsonl, team / "tok" / "tokenizer.json", *extra)
            for extra in (("--force", "--chat-template", "minimind"), ())]
    assert (private / "tokenizer.json").read_text() == "the victim's own tokenizer\n"
    for done in runs:
        assert done.returncode == 2, done.stderr
        assert f"the directory {team} above it" in done.stderr and "nothing written" in done.stderr
    assert sorted(os.listdir(private)) == ["tokenizer.json"]  # no tokenizer_config.json, no temp file


def test_group_share_writes_into_the_team_directory_itself_at_its_descriptor(teammate, demo_jsonl):
    """--group-share: the team directory holding --out is used anyway (as export's and prepare's); without it, it is
    refused before the training, naming the option."""
    (uid, gid), where = teammate
    team = group_dir(where, gid, "grp")
    refused = _train(demo_jsonl, team / "tokenizer.json")
    assert refused.returncode == 2 and "--group-share" in refused.stderr, refused.stderr
    assert os.listdir(team) == []

    done = _train(demo_jsonl, team / "tokenizer.json", "--group-share", "--chat-template", "minimind")
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(team)) == sorted(["tokenizer.json", TOKENIZER_CONFIG])


def test_tokenizer_template_keeps_the_same_rule_for_a_team_directory(teammate, tokenizer):
    """`tokenizer template --out` writes as `tokenizer train --out` does: a team directory refused without
    --group-share (nothing written), written at its descriptor with it."""
    (uid, gid), where = teammate
    team = group_dir(where, gid, "grp")
    template = [sys.executable, "-m", "minilmd.cli", "tokenizer", "template", str(tokenizer), "--chat-template",
                "minimind", "--out", str(team / "tokenizer.json")]
    refused = subprocess.run(template, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--group-share" in refused.stderr, refused.stderr
    assert os.listdir(team) == []
    done = subprocess.run([*template, "--group-share"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(team)) == sorted(["tokenizer.json", TOKENIZER_CONFIG])
    assert (team / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
