"""Scratch is per user and per run, with real Unix users (root and nobody) and real `minilmd run` launches.

- The default scratch is `<base>/minilmd-<uid>/<run.name>` (base: /dev/shm; here a stand-in with /dev/shm's mode
  1777), the per-user root and the scratch 0700, with owner.json naming the run directory.
- Two users with the same run.name each get their own scratch, whoever comes first (the first user's directory used
  to make every later user's launch fail with PermissionError after `--check` said OK).
- Another run directory with the same run.name (a copied config) is refused at --check, at launch and by
  `minilmd train`, exit 2, and the first run's checkpoints are untouched.
- Another user's directory where scratch goes, and a symbolic link in its place, are never used; nothing is written
  through the link. A run.scratch set so is refused; the default's root so taken gets the run a private root
  (tests/test_scratch_squat.py).
- The demo removes only its own marked scratch: never another user's demo, never another run's scratch.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from minilmd.names import SCRATCH_OWNER
from minilmd.protocol import SUPERVISOR_CONFIG
from scratch_helpers import NOBODY, Shared, owned_by_nobody, shared, text_of, two_users  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow  # every test launches `minilmd run` or acts as a second user

UID = {"root": 0, "nobody": NOBODY.pw_uid}


def mode_and_owner(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid


def test_the_default_scratch_is_private_to_its_user_and_marked_for_its_run(shared):
    config = shared.config("root")
    base = shared.base
    checked = shared.users.minilmd("root", "run", "--check", str(config))
    assert checked.returncode == 0 and f"scratch {base}/minilmd-0/same-name" in checked.stdout, text_of(checked)
    assert not (base / "minilmd-0").exists()  # --check creates nothing
    assert shared.users.minilmd("root", "run", str(config)).returncode == 0
    assert mode_and_owner(base / "minilmd-0") == (0o700, 0)
    assert mode_and_owner(base / "minilmd-0" / "same-name") == (0o700, 0)
    owner = json.loads((base / "minilmd-0" / "same-name" / SCRATCH_OWNER).read_text())
    assert owner["run_dir"] == str(config.parent / "same-name" / "run") and owner["uid"] == 0


@pytest.mark.parametrize("first,second", [("root", "nobody"), ("nobody", "root")])
def test_two_users_with_the_same_run_name_each_get_their_own_scratch(shared, first, second):
    base = shared.base
    for user in (first, second):
        config = shared.config(user)
        checked = shared.users.minilmd(user, "run", "--check", str(config))
        assert checked.returncode == 0, text_of(checked)
        launched = shared.users.minilmd(user, "run", str(config))
        assert launched.returncode == 0, text_of(launched)[-3000:]
    for user in (first, second):
        root = base / f"minilmd-{UID[user]}"
        assert mode_and_owner(root) == (0o700, UID[user])
        assert (root / "same-name" / "checkpoints" / "LATEST").is_file()


def test_another_run_directory_with_the_same_name_is_refused_and_the_first_run_is_untouched(shared):
    base = shared.base
    first = shared.config("root", where="first")
    assert shared.users.minilmd("root", "run", str(first)).returncode == 0
    checkpoints = base / "minilmd-0" / "same-name" / "checkpoints"
    before = sorted(p.name for p in checkpoints.iterdir())
    copied = shared.config("root", where="copied")  # the same config, another run.dir
    for args in (("run", "--check", str(copied)), ("run", str(copied)), ("train", str(copied))):
        out = shared.users.minilmd("root", *args, fake=False)
        assert out.returncode == SUPERVISOR_CONFIG, (args, text_of(out)[-3000:])
        assert "belongs to another run: the run directory " + str(first.parent / "same-name" / "run") in text_of(out)
        assert "give this run another run.name, or set run.scratch" in text_of(out) and "Traceback" not in text_of(out)
    assert sorted(p.name for p in checkpoints.iterdir()) == before
    assert not (copied.parent / "same-name" / "run").exists()


def test_another_users_directory_where_scratch_goes_is_refused(shared):
    base = shared.base
    # root made the directory where nobody's default scratch root goes (a careless or hostile other user)
    (base / f"minilmd-{NOBODY.pw_uid}").mkdir(mode=0o700)  # one she cannot even look into
    config = shared.config("nobody")
    for args in (("run", "--check", str(config)), ("run", str(config))):  # never used; the run goes on elsewhere
        out = shared.users.minilmd("nobody", *args)
        assert out.returncode == 0, text_of(out)
        assert f"{base}/minilmd-{NOBODY.pw_uid} belongs to user root (uid 0)" in text_of(out), text_of(out)
    assert list((base / f"minilmd-{NOBODY.pw_uid}").iterdir()) == []  # her private root: tests/test_scratch_squat.py
    # and root never uses a scratch of nobody's, even though it could write there
    theirs = owned_by_nobody(shared.root / "nobodys-scratch")
    mine = shared.config("root", "r", scratch=str(theirs))
    out = shared.users.minilmd("root", "run", str(mine))
    assert out.returncode == SUPERVISOR_CONFIG and f"run.scratch {theirs} belongs to user nobody" in text_of(out)
    assert list(theirs.iterdir()) == []


def test_a_symbolic_link_in_place_of_scratch_is_refused_and_nothing_is_written_through_it(shared):
    base = shared.base
    elsewhere = shared.root / "elsewhere"
    elsewhere.mkdir()
    (base / "minilmd-0").symlink_to(elsewhere)  # the per-user root
    config = shared.config("root")
    explicit = shared.root / "link-scratch"
    explicit.symlink_to(elsewhere)  # a scratch given by hand
    by_hand = shared.config("root", "h", scratch=str(explicit))
    for args in (("run", "--check", str(by_hand)), ("run", str(by_hand))):
        out = shared.users.minilmd("root", *args)
        assert out.returncode == SUPERVISOR_CONFIG, text_of(out)
        assert f"{explicit} is a symbolic link (to {elsewhere})" in text_of(out), text_of(out)
    out = shared.users.minilmd("root", "run", str(config))  # the default's root a link: a private root instead
    assert out.returncode == 0 and f"{base / 'minilmd-0'} is a symbolic link of user root" in text_of(out), \
        text_of(out)
    assert list(elsewhere.iterdir()) == []


DEMO_STEP = """
import sys
from pathlib import Path
from minilmd import scratch
from minilmd.daemon.demo import fresh_start
root = Path(sys.argv[1])
_, s = fresh_start(root)
scratch.claim(s, root / "run", "demo", True)  # what the demo's `minilmd run` does first
(s / "checkpoints").mkdir()
print(s)
"""


def demo_start(shared: Shared, user: str, root: Path):
    return shared.users.python(user, DEMO_STEP.replace("sys.argv[1]", repr(str(root))))


@pytest.mark.parametrize("first,second", [("nobody", "root"), ("root", "nobody")])
def test_the_demo_removes_only_its_own_scratch(shared, first, second):
    made = {}
    for user in (first, second):
        out = demo_start(shared, user, shared.home(user) / "demo-run")
        assert out.returncode == 0, text_of(out)
        made[user] = Path(out.stdout.split()[-1])
    assert made[first] != made[second] and all((s / "checkpoints").is_dir() for s in made.values())
    # a second demo of the same user starts afresh: its own scratch is emptied, the other user's stays
    again = demo_start(shared, second, shared.home(second) / "demo-run")
    assert again.returncode == 0 and Path(again.stdout.split()[-1]) == made[second]
    assert (made[first] / "checkpoints").is_dir()


def test_the_demo_leaves_a_scratch_of_another_run_alone(shared):
    one = demo_start(shared, "root", shared.home("root") / "one" / "demo-run")
    assert one.returncode == 0, text_of(one)
    first = Path(one.stdout.split()[-1])
    # a second demo directory of the same user (a second clone) gets a scratch of its own: the first's stays
    two = demo_start(shared, "root", shared.home("root") / "two" / "demo-run")
    assert two.returncode == 0, text_of(two)
    second = Path(two.stdout.split()[-1])
    assert second != first and (first / "checkpoints").is_dir() and (second / "checkpoints").is_dir()
    # where that demo's scratch goes, a scratch marked for another run directory is left alone
    marker = second / SCRATCH_OWNER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "run_dir": "/elsewhere/run"}))
    other = demo_start(shared, "root", shared.home("root") / "two" / "demo-run")
    assert other.returncode != 0 and "belongs to the run directory" in text_of(other) and "left alone" in text_of(other)
    assert (second / "checkpoints").is_dir() and (first / "checkpoints").is_dir()
    # and a demo directory of another user is never removed
    theirs = owned_by_nobody(shared.root / "theirs" / "demo-run")
    (theirs / "keep").write_text("x")
    out = demo_start(shared, "root", theirs)
    assert out.returncode != 0 and "belongs to user nobody (uid" in text_of(out) and (theirs / "keep").exists()
