"""`prepare --force --group-share` in a team directory (group-writable, not sticky): a teammate (nobody, a real
second user) may rename anything in it, so the victim's own corpus at the --out name proves nothing. Before: he
renamed her other corpus `corpA` to the --out name before she ran `prepare --force`, and it was deleted for good
(the check under the lock saw a prepared corpus of hers). Now --force replaces only the corpus her prepare
published at that name (meta.json's `prepared_at`: its name and inode); anything else is
refused, named, nothing changed. (Moving her corpus in from another directory is no attack: that needs write
permission on the corpus directory itself, for its `..`.)
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from data_helpers import run_prepare
from second_user import second_user, shared, team, user_python  # noqa: F401 - shared, team: fixtures

pytestmark = [pytest.mark.root, pytest.mark.slow]




def _as_nobody(code: str, *args: str) -> None:
    done = subprocess.run(user_python(code, *args), capture_output=True, text=True, cwd="/", timeout=120)
    assert done.returncode == 0, done.stderr


def _tokens(corpus: Path) -> bytes:
    return (corpus / "train" / "tokens.bin").read_bytes()


RENAME_HERS = """
import os, sys
team = sys.argv[1]
os.rename(os.path.join(team, "corpus"), os.path.join(team, "corpus-moved-by-him"))
os.rename(os.path.join(team, "corpA"), os.path.join(team, "corpus"))  # her other corpus, at the --out name
"""


def test_force_refuses_her_other_corpus_a_teammate_renamed_to_the_name(team, demo_jsonl, tokenizer):
    run_prepare(demo_jsonl[:1], tokenizer, team / "corpus", val_fraction=0.1, group_share=True)
    run_prepare(demo_jsonl[:1], tokenizer, team / "corpA", val_fraction=0.3, group_share=True)
    hers = _tokens(team / "corpA")
    _as_nobody(RENAME_HERS, str(team))
    with pytest.raises(ValueError) as refused:
        run_prepare(demo_jsonl[1:2], tokenizer, team / "corpus", val_fraction=0.1, force=True, group_share=True)
    message = str(refused.value)
    assert "prepared as 'corpA'" in message and "nothing was changed" in message, message
    assert _tokens(team / "corpus") == hers  # corpA, whole, where he put it
    assert (team / "corpus-moved-by-him" / "meta.json").is_file()


def test_force_refuses_a_copy_and_replaces_what_her_prepare_published(team, tmp_path, demo_jsonl, tokenizer):
    """A copy (`cp -r`, an older minilmd's corpus: no record of where it was prepared) is refused there; the
    corpus her prepare published at the name is replaced, its record the new corpus's."""
    run_prepare(demo_jsonl[:1], tokenizer, tmp_path / "private", val_fraction=0.1)
    subprocess.run(["cp", "-r", str(tmp_path / "private"), str(team / "copied")], check=True)
    with pytest.raises(ValueError) as refused:
        run_prepare(demo_jsonl[1:2], tokenizer, team / "copied", val_fraction=0.1, force=True, group_share=True)
    assert "written for another directory (a copy" in str(refused.value), refused.value
    run_prepare(demo_jsonl[:1], tokenizer, team / "corpus", val_fraction=0.1, group_share=True)
    before = _tokens(team / "corpus")
    run_prepare(demo_jsonl[1:2], tokenizer, team / "corpus", val_fraction=0.1, force=True, group_share=True)
    assert _tokens(team / "corpus") != before
    record = json.loads((team / "corpus" / "meta.json").read_text())["prepared_at"]
    assert record == {"name": "corpus", "inode": (team / "corpus").stat().st_ino}


HIS_OWN = """
import os, sys
team = sys.argv[1]
os.rename(os.path.join(team, "corpus"), os.path.join(team, "corpus-moved-by-him"))
os.mkdir(os.path.join(team, "corpus"), 0o755)  # his own directory at her --out name
"""


def test_force_refuses_a_teammates_directory_at_the_name_naming_him(team, demo_jsonl, tokenizer):
    run_prepare(demo_jsonl[:1], tokenizer, team / "corpus", val_fraction=0.1, group_share=True)
    _as_nobody(HIS_OWN, str(team))
    uid, _ = second_user()
    with pytest.raises(ValueError) as refused:
        run_prepare(demo_jsonl[1:2], tokenizer, team / "corpus", val_fraction=0.1, force=True, group_share=True)
    assert f"a directory of another user, user nobody (uid {uid})" in str(refused.value), refused.value
    assert (team / "corpus").stat().st_uid == uid and (team / "corpus-moved-by-him" / "meta.json").is_file()
