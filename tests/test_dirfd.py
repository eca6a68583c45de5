"""minilmd/dirfd.py, the one way to write where others can change, on its own (the attacks by a second user that
it stops are tests/test_shared_write_attacks.py): the rule of a place, a temporary directory of a random name used
through its descriptor, a publication that replaces only the directory it was told (minilmd/dirpublish.py), a
removal only of what is expected, and a file replaced atomically without following a link."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from minilmd import perms
from minilmd.compile_cache import user_dir_problem
from minilmd.dirfd import Dir, PlaceRefused, Replaced, place_problem
from minilmd.dirpublish import publish


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def shared_group(path: Path) -> None:
    """Give `path` a group whose members are not this user alone (perms.private_group): as root a gid no group has
    (its members cannot be told, so they count as others); as a user, its own group, unless that is private."""
    if os.geteuid() == 0:
        os.chown(path, -1, 4242)
    elif perms.private_group(path.stat().st_gid):
        pytest.skip("this user's group is its own (a user private group): no group of others to give the directory")


def test_a_directory_others_can_rearrange_is_refused_unless_the_owner_opts_in_for_that_one(tmp_path):
    team = tmp_path / "team"
    team.mkdir()
    shared_group(team)  # root's group is root's alone: not a team's
    team.chmod(0o770)
    problem = place_problem("--out", team / "corpus", "the corpus", "choose another")
    assert f"the directory {team} above it can be written by other users (mode 770, not sticky)" in problem
    assert place_problem("--out", team / "corpus", "the corpus", "x", group_share=True) is None
    assert place_problem("--out", team / "sub" / "corpus", "the corpus", "x", group_share=True) is not None
    with pytest.raises(PlaceRefused, match="can be written by other users"):
        Dir.open(team, "the directory of --out")
    Dir.open(team, "the directory of --out", group_share=True).close()
    team.chmod(0o1777)  # sticky and ours (root's in CI): like /tmp, fine above a place, and for a compile cache's
    assert user_dir_problem("TORCHINDUCTOR_CACHE_DIR", str(team / "cache")) is None


def test_team_above_lets_group_writable_directories_above_a_remote_but_no_world_writable_or_foreign_one(tmp_path):
    """run.remote = /nfs/team/alice/run1 under a 2775 /nfs/team: refused before (group_share waived the root
    alone); with team_above the directories above may be group-writable, still not world-writable unless sticky,
    still root's or this user's."""
    team = tmp_path / "team"
    (team / "alice").mkdir(parents=True)
    shared_group(team)
    team.chmod(0o2775)
    root = team / "alice" / "run1"

    def problem(**kw) -> str | None:
        return place_problem("run.remote", root, "the checkpoints", "choose another", dir_itself=True,
                             group_share=True, **kw)

    assert "can be written by other users (mode 2775, not sticky)" in problem()
    assert problem(team_above=True) is None
    Dir.open(team / "alice", "run.remote", group_share=True, team_above=True).close()
    team.chmod(0o777)
    assert "can be written by other users (mode 777, not sticky)" in problem(team_above=True)
    team.chmod(0o1777)  # sticky, root's (ours): like /tmp
    assert problem(team_above=True) is None
    if os.geteuid() == 0:
        os.chown(team / "alice", 4242, -1)
        assert "belongs to uid 4242" in problem(team_above=True)


def test_a_link_on_the_way_is_followed_only_when_it_is_ours_and_leads_to_a_place_that_passes(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via").symlink_to(real)
    assert place_problem("--out", tmp_path / "via" / "c", "the corpus", "x", own_links=True) is None
    assert "is a symbolic link" in place_problem("--out", tmp_path / "via" / "c", "the corpus", "x")
    real.chmod(0o777)
    assert "can be written by other users" in place_problem("--out", tmp_path / "via" / "c", "the corpus", "x",
                                                            own_links=True)


def test_a_temporary_directory_is_private_randomly_named_and_reached_by_its_descriptor(tmp_path):
    with Dir.open(tmp_path, "here") as here:
        one, name = here.make_temp(".out.prepare-h-1-2")
        two, other = here.make_temp(".out.prepare-h-1-2")
        assert name != other and name.startswith(".out.prepare-h-1-2.") and len(name.rsplit(".", 1)[1]) == 8
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o700
        os.rename(tmp_path / name, tmp_path / "moved")  # renamed: the descriptor still reaches it
        (one.inside / "f").write_text("mine")
        assert (tmp_path / "moved" / "f").read_text() == "mine"
        here.discard(one, name)  # emptied through its descriptor; the name, no longer its, left
        assert list((tmp_path / "moved").iterdir()) == [] and not (tmp_path / name).exists()
        here.discard(two, other)
        assert not (tmp_path / other).exists()


def _corpus(root: Path, text: str) -> Path:
    root.mkdir()
    (root / "meta.json").write_text(text)
    return root


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "NFS: aside and back"])
def test_publish_replaces_only_the_directory_it_was_told_and_deletes_nothing_else(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(Dir, "exchange", lambda self, a, b: False)
    _corpus(tmp_path / "out", "old")
    with Dir.open(tmp_path, "here") as here:
        checked = here.identity_of("out")
        tmp, name = here.make_temp(".out.prepare-h-1-2")
        (tmp.inside / "meta.json").write_text("new")
        os.rename(tmp_path / "out", tmp_path / "out-moved")
        _corpus(tmp_path / "out", "her other corpus")  # moved to the name meanwhile
        with pytest.raises(Replaced, match="nothing was replaced"):
            publish(here, tmp, name, "out", checked, aside=name + ".old")
        assert _tree(tmp_path / "out") == {"meta.json": b"her other corpus"}
        assert _tree(tmp_path / "out-moved") == {"meta.json": b"old"}
        os.rename(tmp_path / "out", tmp_path / "other")
        os.rename(tmp_path / "out-moved", tmp_path / "out")
        publish(here, tmp, name, "out", checked, aside=name + ".old")  # the one checked: replaced
        assert _tree(tmp_path / "out") == {"meta.json": b"new"}
        assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "out"]


def test_publish_of_a_new_output_refuses_a_name_taken_meanwhile_and_a_swapped_temporary_directory(tmp_path):
    with Dir.open(tmp_path, "here") as here:
        tmp, name = here.make_temp(".out.prepare-h-1-2")
        _corpus(tmp_path / "out", "appeared")
        with pytest.raises(Replaced, match="appeared while this ran"):
            publish(here, tmp, name, "out", None, aside=name + ".old")
        assert _tree(tmp_path / "out") == {"meta.json": b"appeared"}
        os.rename(tmp_path / name, tmp_path / "moved")
        _corpus(tmp_path / name, "his")
        with pytest.raises(Replaced, match="temporary directory was replaced"):
            publish(here, tmp, name, "new", None, aside=name + ".old")
        assert not (tmp_path / "new").exists() and _tree(tmp_path / name) == {"meta.json": b"his"}
        here.discard(tmp, name)
        assert _tree(tmp_path / name) == {"meta.json": b"his"}  # not ours: never emptied nor removed


def test_remove_tree_removes_only_the_directory_expected(tmp_path):
    with Dir.open(tmp_path, "here") as here:
        _corpus(tmp_path / "a", "a")
        expected = here.identity_of("a")
        os.rename(tmp_path / "a", tmp_path / "b")
        _corpus(tmp_path / "a", "another")
        assert not here.remove_tree("a", expected)
        assert _tree(tmp_path / "a") == {"meta.json": b"another"}
        assert here.remove_tree("b", expected) and not (tmp_path / "b").exists()


def test_write_atomic_replaces_a_link_at_the_name_never_what_it_points_to(tmp_path):
    victim = tmp_path / "private.txt"
    victim.write_text("hers")
    victim.chmod(0o600)
    (tmp_path / "s.prom").symlink_to(victim)
    with Dir.open(tmp_path, "here") as here:
        here.write_atomic("s.prom", b"gauges\n", 0o644)
        with pytest.raises(OSError):
            (tmp_path / "link").symlink_to(victim)
            here.mode_file("link", 0o644)
    assert victim.read_text() == "hers" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not (tmp_path / "s.prom").is_symlink() and (tmp_path / "s.prom").read_text() == "gauges\n"
    assert stat.S_IMODE((tmp_path / "s.prom").stat().st_mode) == 0o644


def test_prepare_makes_the_missing_directories_to_its_out_writable_by_its_user_alone(tmp_path, demo_jsonl,
                                                                                     tokenizer):
    """Under a umask of 002 the directories prepare made on the way to --out were group-writable: a place others
    could rearrange, which the lock's check would refuse right after making it. They are made 0755 now."""
    from data_helpers import run_prepare

    old = os.umask(0o002)
    try:
        run_prepare(demo_jsonl[:1], tokenizer, tmp_path / "new" / "deeper" / "c", val_fraction=0.1)
    finally:
        os.umask(old)
    for made in (tmp_path / "new", tmp_path / "new" / "deeper", tmp_path / "new" / "deeper" / "c"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o755, made


def test_rename_new_without_noreplace_never_replaces_an_empty_directory(tmp_path, monkeypatch):
    """NFS has no RENAME_NOREPLACE; a plain rename(2) replaces an empty directory at the new name, which in a team
    directory may be a teammate's. The fallback claims the name first and replaces only its own claim."""
    monkeypatch.setattr("minilmd.dirfd.renameat2", lambda *args: False)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "f").write_text("mine")
    (tmp_path / "hers").mkdir()
    hers = (tmp_path / "hers").stat().st_ino
    (tmp_path / "a-file").write_text("file")
    (tmp_path / "taken").write_text("taken")
    with Dir.open(tmp_path, "here") as here:
        assert not here.rename_new("mine", "hers")
        assert (tmp_path / "hers").stat().st_ino == hers and not any((tmp_path / "hers").iterdir())
        assert not here.rename_new("a-file", "taken") and (tmp_path / "taken").read_text() == "taken"
        assert here.rename_new("mine", "free") and (tmp_path / "free" / "f").read_text() == "mine"
        assert here.rename_new("a-file", "free-file") and (tmp_path / "free-file").read_text() == "file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["free", "free-file", "hers", "taken"]


def test_publish_says_where_the_old_version_is_when_it_cannot_be_put_back(tmp_path, monkeypatch):
    """NFS: the old version goes aside, the new one to its name; someone moves another directory there meanwhile
    and the old one cannot go back (the name is taken). The message said "it was put back"; it says where it is."""
    monkeypatch.setattr(Dir, "exchange", lambda self, a, b: False)
    real_rename = Dir.rename

    def rename_then_swap(self, name, to, to_name):
        real_rename(self, name, to, to_name)
        os.rename(tmp_path / to_name, tmp_path / "moved-away")
        _corpus(tmp_path / to_name, "his")

    monkeypatch.setattr(Dir, "rename", rename_then_swap)
    _corpus(tmp_path / "out", "old")
    with Dir.open(tmp_path, "here") as here:
        checked = here.identity_of("out")
        tmp, name = here.make_temp(".out.prepare-h-1-2")
        with pytest.raises(Replaced, match=f"could not be put back \\(it is at {tmp_path / (name + '.old')}\\)"):
            publish(here, tmp, name, "out", checked, aside=name + ".old")
    assert _tree(tmp_path / (name + ".old")) == {"meta.json": b"old"}  # nothing deleted
    assert _tree(tmp_path / "out") == {"meta.json": b"his"}


def test_publish_leaves_an_old_version_that_changed_since_it_was_checked(tmp_path):
    """What was checked when the caller began may hold more by the time of the swap (a prepare takes hours): the
    caller's `foreign` looks again through the descriptor; what it finds is left at `keep_as`, nothing deleted."""
    _corpus(tmp_path / "out", "old")
    with Dir.open(tmp_path, "here") as here:
        checked = here.identity_of("out")
        tmp, name = here.make_temp(".out.prepare-h-1-2")
        (tmp.inside / "meta.json").write_text("new")
        (tmp_path / "out" / "thesis.txt").write_text("hers")
        kept = publish(here, tmp, name, "out", checked, aside=name + ".old", keep_as="out.kept",
                       foreign=lambda old: ", ".join(sorted(set(os.listdir(old.fd)) - {"meta.json"})))
    assert kept == (tmp_path / "out.kept", "thesis.txt")
    assert _tree(tmp_path / "out.kept") == {"meta.json": b"old", "thesis.txt": b"hers"}
    assert _tree(tmp_path / "out") == {"meta.json": b"new"}


def test_a_tree_deeper_than_the_bound_is_neither_removed_nor_walked(tmp_path):
    from minilmd.dirtree import MAX_TREE_DEPTH

    deep = tmp_path / "a"
    (deep / "top.txt").parent.mkdir()
    (deep / "top.txt").write_text("top")
    bottom = deep.joinpath(*["d"] * (MAX_TREE_DEPTH + 2))
    bottom.mkdir(parents=True)
    (bottom / "bottom.txt").write_text("bottom")
    with Dir.open(tmp_path, "here") as here:
        assert not here.remove_tree("a", here.identity_of("a"))
    assert (deep / "top.txt").read_text() == "top" and (bottom / "bottom.txt").read_text() == "bottom"


def test_a_sticky_directory_of_a_listed_owner_is_refused_as_sticky(tmp_path, monkeypatch):
    """`owners` (a squashing share's uid) count as ours for a directory no one but its owner may write; a sticky
    one that others may write is still refused (its owner may remove or rename anything in it). The refusal said
    "mode 1777, not sticky" of a directory that is sticky; it says why a sticky one is not enough."""
    from minilmd.place_rule import open_walked

    listed = tmp_path / "squashed"
    listed.mkdir()
    if os.geteuid() == 0:
        os.chown(listed, 4242, 4242)  # root's would pass as root's: the share's owner is another uid
    else:
        monkeypatch.setattr(perms, "own_uid", lambda: os.getuid() + 1)  # this user's directory is the listed one's
    owner = listed.stat().st_uid
    listed.chmod(0o1777)
    problem = place_problem("run.remote", listed, "the checkpoints", "choose another", dir_itself=True,
                            owners={owner})
    assert problem is not None and "not sticky" not in problem, problem
    said = "(mode 1777: sticky, but only a sticky directory of root's or yours is trusted, since its owner may "
    assert said in problem, problem
    with pytest.raises(PlaceRefused) as refused:  # the walk's judgement, on the descriptor: the same words
        open_walked(listed, "run.remote", "the checkpoints", "choose another", owners={owner})
    assert said in str(refused.value) and "not sticky" not in str(refused.value)
    listed.chmod(0o755)  # no one but its owner writes it: counted as ours
    assert place_problem("run.remote", listed, "the checkpoints", "x", dir_itself=True, owners={owner}) is None
