"""`minilmd export --out` in a directory another user can write: before, the export made its temporary copy
beside --out by name, wrote into it by name (safetensors, json, the .pth's rename) and published it by name. Whoever
could write that directory could swap the copy for a link to a directory of the victim's (the export then overwrote
her model.safetensors and config.json there), or for a link or a FIFO after the .pth was closed (renamed onto --out
as if it were the export). Now the directory of --out is held to minilmd/dirfd.py's rule (prepare's): refused when
another user owns it or can rearrange it; and the copy is a 0700 directory used through its descriptor, published
only while its name still leads to it (export_paths.ExportCopy)."""
from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minilmd import leftovers, perms
from minilmd.cli import app
from minilmd.trainer.model.export import ExportError, export_hf, write_minimind
from real_groups import groups  # noqa: F401 - a fixture
from second_user import second_user
from weights_helpers import export_checkpoint

torch.set_num_threads(1)
HERS = b"the victim's own file, not to be overwritten\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return export_checkpoint(tmp_path_factory.mktemp("hostile-out"), seed=5)


def _out(place: Path, fmt: str) -> Path:
    return place / ("m.pth" if fmt == "minimind" else "hf")


@pytest.mark.parametrize("fmt", ["minimind", "hf"])
@pytest.mark.parametrize("place", ["another user's", "writable by all, not sticky"])
def test_an_out_in_a_directory_others_can_rearrange_is_refused_before_anything_is_written(checkpoint, tmp_path,
                                                                                           fmt, place):
    """The directory of --out belongs to another user (a real chown to nobody; root may write there all the same),
    or anyone may write it and it is not sticky: before, the export wrote there by name. Now exit 2 naming the
    directory and why, nothing written in it."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    if place == "another user's":
        uid, gid = second_user()
        os.chown(theirs, uid, gid)
        why = "belongs to user nobody"
    else:
        theirs.chmod(0o777)
        why = "can be written by other users (mode 777, not sticky)"
    out = _out(theirs, fmt)
    result = CliRunner().invoke(app, ["export", str(checkpoint), "--format", fmt, "--out", str(out)])
    assert result.exit_code == 2 and not isinstance(result.exception, Exception), (result.output, result.exception)
    assert f"minilmd export: the directory of --out {theirs}: the directory {theirs} {why}" in result.output, \
        result.output
    assert "nothing was written" in result.output
    assert list(theirs.iterdir()) == []


def _swap_the_copy_for_a_link_to(victim: Path, out: Path):
    """What someone who can write the directory of --out does the moment the export has made its temporary copy
    (the export then sweeps leftovers, before it writes): the copy renamed away, a link to the victim's in its
    place. Wraps leftovers.sweep, the first thing the export does after it made its copy."""
    sweep = leftovers.sweep

    def swapped_then_swept(*args, **kwargs):
        [copy] = [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp-")]
        copy.rename(out.parent / "moved-away")
        copy.symlink_to(victim)
        return sweep(*args, **kwargs)

    return swapped_then_swept


@pytest.mark.parametrize("fmt", ["minimind", "hf"])
def test_a_copy_swapped_for_a_link_to_the_victims_files_is_never_written_through_nor_published(
        checkpoint, tmp_path, fmt, monkeypatch):
    """The temporary copy swapped for a link to the victim's directory (hf: before, safetensors' save_file and
    write_text overwrote her model.safetensors and config.json there, and the link was renamed onto --out) or to
    her file (.pth: the link renamed onto --out, export said "wrote"). Now every write goes through the copy's
    descriptor, and publishing finds its name no longer leads to it: ExportError, nothing published, her files
    as they were, the link left where it was put."""
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("model.safetensors", "config.json", "m.pth"):
        (victim / name).write_bytes(HERS)
    out = _out(tmp_path / "out", fmt)
    out.parent.mkdir()
    monkeypatch.setattr(leftovers, "sweep", _swap_the_copy_for_a_link_to(victim / "m.pth" if fmt == "minimind"
                                                                         else victim, out))
    with pytest.raises(ExportError, match="the temporary directory was replaced by another one"):
        if fmt == "minimind":
            write_minimind(checkpoint, out)
        else:
            export_hf(checkpoint, out)
    assert sorted(p.name for p in victim.iterdir()) == ["config.json", "m.pth", "model.safetensors"]
    assert all((victim / name).read_bytes() == HERS for name in ("model.safetensors", "config.json", "m.pth"))
    assert not out.exists() and not out.is_symlink()
    [link] = [p for p in out.parent.iterdir() if p.is_symlink()]
    assert link.name.startswith(f".{out.name}.tmp-")
    assert list((out.parent / "moved-away").iterdir()) == []  # our copy, emptied through its descriptor


def test_an_out_in_a_directory_of_this_users_private_group_is_written(checkpoint, tmp_path, groups):
    """Debian's user private groups and umask 002: a plain `mkdir ~/exports` is 0775, group the user's own. Its
    only member is the user (perms.private_group): before, refused as writable by others (exit 2); now written."""
    exports = tmp_path / "exports"
    exports.mkdir()
    os.chown(exports, -1, groups.group(members=(pwd.getpwuid(os.geteuid()).pw_name,)))
    exports.chmod(0o2775)
    result = CliRunner().invoke(app, ["export", str(checkpoint), "--format", "minimind", "--out",
                                      str(exports / "m.pth")])
    assert result.exit_code == 0, (result.output, result.exception)
    assert [p.name for p in exports.iterdir()] == ["m.pth"]


@pytest.mark.parametrize("fmt", ["minimind", "hf"])
def test_group_share_exports_into_a_team_directory(checkpoint, tmp_path, fmt):
    """A team directory (2775, a group of others): refused without --group-share, naming it (before: refused
    with no way to opt in); with it, written (its copy 0700, published through the directory's descriptor) and
    nothing else left there. Directories above it stay held to the rule."""
    team = tmp_path / "team"
    team.mkdir()
    if os.geteuid() == 0:
        os.chown(team, -1, 4242)  # a group of others (root's own group is root's alone)
    elif perms.private_group(team.stat().st_gid):
        pytest.skip("this user's group is its own: no group of others to give the directory")
    team.chmod(0o2775)
    out = _out(team, fmt)
    args = ["export", str(checkpoint), "--format", fmt, "--out", str(out)]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "--group-share" in refused.output, (refused.output, refused.exception)
    assert list(team.iterdir()) == []
    result = CliRunner().invoke(app, [*args, "--group-share"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert [p.name for p in team.iterdir()] == [out.name]
    below = team / "below"
    below.mkdir()
    result = CliRunner().invoke(app, ["export", str(checkpoint), "--format", fmt, "--out",
                                      str(_out(below, fmt)), "--group-share"])
    assert result.exit_code == 2 and f"the directory {team} above it can be written" in result.output
