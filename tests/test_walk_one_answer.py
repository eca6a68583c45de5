"""Each place minilmd writes in is judged once, by the walk that reaches it (minilmd/place_rule.py walk_to): a check
made before the use (walk_problem) is that walk with nothing made, so both give one answer however the place is
spelled. A judgement by path (abspath) read `a/link/../b` as `a/b`, where the walk, as the kernel, goes up from where
the link leads: it refused a directory the walk would use, or passed one the walk refuses.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minilmd import fsio
from minilmd.dirfd import Dir, PlaceRefused
from minilmd.place_rule import SCRATCH_ADVICE, walk_problem

OPENED = " (found so when opened)"
"""What a walk that opens adds to its refusal, which a check's (nothing opened) does not say."""


def _places(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(her home, `good`, `open`): in her home `link` leads to good/sub, `wide` to open/sub; home/b is a 0777
    directory (refused: others may rename what is in it), good/b a 0755 one, open a 0777 one above open/sub and
    open/b. By path `home/link/../b` is the refused home/b; by the walk, the kernel's good/b. By path `home/wide/..`
    is the home; by the walk, open."""
    home, good, wide = tmp_path / "home", tmp_path / "good", tmp_path / "open"
    for made in (home / "b", good / "sub", good / "b", wide / "sub", wide / "b"):
        made.mkdir(parents=True)
    (home / "b").chmod(0o777)
    wide.chmod(0o777)
    (home / "link").symlink_to(good / "sub")
    (home / "wide").symlink_to(wide / "sub")
    return home, good, wide


def _spellings(home: Path) -> list[Path]:
    return [home / "link" / ".." / "b", home / "link" / "..", home / "wide" / "..", home / "wide" / ".." / "b",
            home / "link" / ".." / ".." / "home", home / "b", home / "link" / ".." / ".." / "open" / "sub",
            home / "." / "link" / ".." / "sub"]


def _dir_open_answer(spelling: Path) -> str | tuple[int, int]:
    """Dir.open's answer: the identity of what it opened, or its refusal in a check's words."""
    try:
        with Dir.open(spelling, "the test's directory") as opened:
            return opened.identity
    except PlaceRefused as e:
        return str(e).removesuffix(OPENED)


def test_dir_open_answers_as_its_walk_for_every_spelling(tmp_path):
    """Dir.open (run.remote's root, scratch, run.dir's views) refuses exactly what its walk refuses, in its words,
    and opens the directory the kernel's open of that spelling reaches. Before, its judgement by path came first:
    `home/link/../b` was refused for home/b (mode 777), which the walk never reaches (it opens good/b)."""
    home, good, _ = _places(tmp_path)
    for spelling in _spellings(home):
        what, advice = f"what minilmd makes in {spelling}", "choose a directory only you (and root) can change"
        problem = walk_problem(spelling, "the test's directory", what, advice)
        st = os.stat(spelling)
        assert (_dir_open_answer(spelling), spelling) == (problem or (st.st_dev, st.st_ino), spelling)
    assert isinstance(_dir_open_answer(home / "link" / ".." / "b"), tuple)  # the one refused by path
    assert os.path.samefile(home / "link" / ".." / "b", good / "b")


def test_dir_open_refuses_dot_dot_that_ends_in_a_directory_others_may_write(tmp_path):
    """The other way: `home/wide/..` is home by path, but open (0777) for the walk and the kernel: refused, on the
    way through it already."""
    home, _, wide = _places(tmp_path)
    with pytest.raises(PlaceRefused, match=f"the directory {wide} above it can be written by other users"):
        Dir.open(home / "wide" / "..", "the test's directory")


def _outs(home: Path) -> list[Path]:
    """Spellings of an output file: in good/b, in good (through `link`), in open or open/b (through `wide`), in the
    0777 home/b, in directories not there yet below good."""
    return [home / "link" / ".." / "b" / "out", home / "link" / ".." / "out", home / "wide" / ".." / "out",
            home / "wide" / ".." / "b" / "out", home / "b" / "out", home / "link" / ".." / "new" / "deeper" / "out",
            home / "link" / ".." / ".." / "good" / "out"]


def _refusal(use) -> str | None:
    """The words of the PlaceRefused (a ValueError) `use` raises, as a check says them; None when it passes."""
    try:
        opened = use()
    except ValueError as e:
        return str(e).removesuffix(OPENED)
    if opened is not None:
        opened.close()
    return None


def test_an_exports_check_answers_as_the_walk_that_opens_its_directory(tmp_path):
    """export's --out: its check before the checkpoint is read (checked_out) and the walk that opens the directory
    to write (fsio.open_out_parent) give one answer, in one set of words, for every spelling. Before, the check was
    by path: `home/link/../b/out` was refused for home/b (0777), where the export writes in good/b; `home/wide/../out`
    passed, where the write is refused (open, 0777)."""
    from minilmd.trainer.model.export_paths import OUT_ADVICE, OutRefused, checked_out

    home, _, _ = _places(tmp_path)
    for out in _outs(home):
        try:
            checked: str | None = None
            checked_out(out)
        except OutRefused as e:
            checked = str(e).removesuffix("; nothing was written")
        used = _refusal(lambda: fsio.open_out_parent(out, "--out", "the export", OUT_ADVICE))
        assert (checked, out) == (used, out)
    assert _refusal(lambda: fsio.open_out_parent(home / "link" / ".." / "b" / "out", "--out", "the export",
                                                 OUT_ADVICE)) is None  # the one the check by path refused
    assert _refusal(lambda: fsio.open_out_parent(home / "wide" / ".." / "out", "--out", "the export",
                                                 OUT_ADVICE)) is not None  # the one it passed


def test_prepares_check_answers_as_the_walk_that_makes_the_directory_of_out(tmp_path):
    """prepare --out: check_out_place (before anything is made) and make_out_parent (the walk that makes the
    directories of --out) give one answer for every spelling. Before, the check was by path (as export's)."""
    from minilmd.corpus.prepare.lock import check_out_place, make_out_parent

    home, _, _ = _places(tmp_path)
    for out in _outs(home):
        checked = _refusal(lambda: check_out_place(out, False))
        used = _refusal(lambda: make_out_parent(out, False, 0o755))
        assert (checked and checked.removesuffix("; nothing was changed"), out) == (used, out)
    assert _refusal(lambda: check_out_place(home / "link" / ".." / "b" / "out", False)) is None


def test_the_lock_directorys_check_answers_as_the_walk_that_opens_it_to_lease(tmp_path):
    """gpu.lock_dir: `run --check`'s and the wait's judgement (leases.lock_dir_problem) and the walk a lease is taken
    through (leases.open_lease) give one answer, in one set of words, for every spelling. Before, the judgement was
    by path: `home/link/../b` was refused for home/b (0777), where the lease is taken in good/b, so every card
    stayed busy with a reason the walk would not give; `home/wide/..` passed the check, then no lease was taken."""
    from minilmd.daemon.host import leases

    home, good, _ = _places(tmp_path)
    for lock_dir in [*_spellings(home), home / "link" / ".." / "locks", home / "wide" / ".." / "locks"]:
        checked = leases.lock_dir_problem(lock_dir)
        try:
            used: str | None = None
            leases.open_lease(lock_dir, "GPU-a").close()
        except leases.LeaseUnsafe as e:
            used = str(e)
        assert (checked, lock_dir) == (used, lock_dir)
    assert leases.lock_dir_problem(home / "link" / ".." / "b") is None and (good / "b" / "GPU-a").is_file()
    assert leases.lock_dir_problem(home / "wide" / "..") is not None


def test_a_file_in_the_way_of_the_lock_directory_is_said_by_the_check_as_by_the_walk(tmp_path):
    """A file where gpu.lock_dir's directory should be: the check says it (no other check does), in the walk's words."""
    from minilmd.daemon.host import leases

    (tmp_path / "file").write_text("")
    lock_dir = tmp_path / "file" / "locks"
    with pytest.raises(leases.LeaseUnsafe) as used:
        leases.open_lease(lock_dir, "GPU-a")
    assert leases.lock_dir_problem(lock_dir) == str(used.value)
    assert f"{tmp_path / 'file'} is a file, not a directory; choose another lock directory" in str(used.value)


def test_the_demos_check_answers_as_the_walk_that_makes_its_directory(tmp_path):
    """The demo directory: fresh_start's judgement before anything is removed and the walk that reaches (and makes)
    it give one answer. Before, both were given abspath's spelling: `home/link/../b` was refused for home/b (0777),
    where the kernel's path is good/b; `home/wide/../demo` passed and home/demo was made, where the kernel's path is
    in open (0777)."""
    from minilmd.daemon import demo

    home, good, _ = _places(tmp_path)
    assert demo.fresh_start(home / "link" / ".." / "b")[0] == good / "b"
    assert (good / "b" / demo.DEMO_MARKER).is_file()
    given = home / "wide" / ".." / "demo"
    problem = walk_problem(given, demo.DEMO_LABEL, demo.DEMO_WHAT, demo.DIR_ADVICE)
    assert problem is not None and "can be written by other users" in problem
    with pytest.raises(SystemExit) as refused:
        demo.fresh_start(given)
    assert refused.value.code == f"demo: {problem}; nothing was removed"
    assert not (home / "demo").exists()


def test_a_compile_cache_the_user_set_is_judged_where_torchs_opens_go(tmp_path):
    """TORCHINDUCTOR_CACHE_DIR and the like, set by the user: judged by the walk (walk_problem), which goes where the
    kernel's opens by path (torch's) go. Before, by path (place_problem on abspath): `home/link/../b` was refused
    for home/b (0777) where torch writes in good/b (ours, 0755); `home/wide/../c` passed where torch would make c in
    open (0777), which another user may rearrange."""
    from minilmd.compile_cache import CACHE_ADVICE, user_dir_problem

    home, _, _ = _places(tmp_path)
    var = "TORCHINDUCTOR_CACHE_DIR"
    for value in [*_spellings(home), home / "wide" / ".." / "c", home / "link" / ".." / "c"]:
        walked = walk_problem(value, var, "the compile cache", CACHE_ADVICE)
        if walked:  # refused by the walk: in its words (passed: the cache's own look at what is there follows)
            assert (user_dir_problem(var, str(value)), value) == (walked, value)
    assert user_dir_problem(var, str(home / "link" / ".." / "b")) is None
    assert user_dir_problem(var, str(home / "wide" / ".." / "c")) is not None


def test_a_printed_merges_base_is_judged_where_its_load_goes(tmp_path):
    """init_model.own_base: the base a printed merge names is judged by the walk to the file (walk_problem), where the
    pasted command's torch.load goes. Before, by path (abspath): `home/link/../b/base.pth` was not named for home/b
    (0777), where the file loaded is in good/b (ours, 0755); `home/wide/../base.pth` was named, its directory open
    (0777): another user could rename his file over hers before she pastes."""
    from minilmd.init_model import BASE_ADVICE, own_base

    home, good, wide = _places(tmp_path)
    for directory in (good / "b", wide):
        (directory / "base.pth").write_bytes(b"weights")
    for base in (home / "link" / ".." / "b" / "base.pth", home / "wide" / ".." / "base.pth"):
        walked = walk_problem(base, "the base", "the base", BASE_ADVICE)
        assert (own_base(str(base)), base) == (walked or "", base)
    assert own_base(str(home / "link" / ".." / "b" / "base.pth")) == ""
    assert "can be written by other users" in own_base(str(home / "wide" / ".." / "base.pth"))


def test_a_printed_commands_output_place_is_the_abspath_its_own_check_opens(tmp_path, monkeypatch):
    """init_model.own_place: the pasted command opens the directory of os.path.abspath(its output) (OWN_DIR_CODE),
    so the place is judged by path, and looked at and printed as that abspath too. Before, it was looked at as
    spelt (the kernel's good/x for a $HOME of `home/link/../x`) but judged and opened as home/x: a place printed
    that the command could not open. Now refused while home/x is missing, printed (as home/x) once it is there."""
    from minilmd.init_model import own_place

    home, good, _ = _places(tmp_path)
    (good / "x").mkdir(mode=0o700)
    monkeypatch.chdir(home / "b")  # 0777: not a place for the output
    monkeypatch.setenv("HOME", str(home / "link" / ".." / "x"))
    assert own_place() == ""
    (home / "x").mkdir(mode=0o700)
    assert own_place() == str(home / "x")


def test_the_scratchs_check_answers_as_the_walk_that_opens_it(tmp_path):
    """run.scratch: problems() (run --check, the claim) judges the way to it by the walk Dir.open takes to it
    (minilmd/trainer_lock.py), the scratch itself waived there (judged by its own, stricter rule after). Before, by
    path (place_problem, abspath): `home/link/../b/scr` was refused for home/b (0777), where the scratch is made in
    good/b; `home/wide/../scr` passed, where it is made in open (0777), which others may rearrange."""
    from minilmd import scratch

    home, good, _ = _places(tmp_path)
    run_dir = tmp_path / "run"
    for where in (home / "link" / ".." / "b" / "scr", home / "wide" / ".." / "scr", home / "b" / "scr",
                  home / "link" / ".." / "scr"):
        walked = walk_problem(where, "run.scratch", "the scratch", SCRATCH_ADVICE, group_share=True)
        assert (scratch.problems(where, run_dir, False), where) == ([walked] if walked else [], where)
    assert scratch.problems(home / "wide" / ".." / "scr", run_dir, False) != []
    spelt = home / "link" / ".." / "b" / "scr"
    claimed = scratch.claim(spelt, run_dir, "r", False)
    with Dir.open(spelt, "run.scratch") as opened:
        assert opened.identity == (claimed.dev, claimed.ino) == (os.stat(good / "b" / "scr").st_dev,
                                                                 os.stat(good / "b" / "scr").st_ino)
