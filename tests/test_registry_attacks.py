"""The shared run registry under attack, with two real Unix users (root and nobody, through setpriv) and, where a
third is needed, a uid with no account (root can give a file any owner).

Every attack here worked on the registry before the hardened reader: one file of nested `[` crashed every user's
`status --all`; a state.json that is a FIFO hung root's; a squatted entry name left a run unregistered, or root's
run replaced the squatter's file; a shadow entry made root see her run as his; a crafted name made root's `forget`
delete a file outside the registry; escape sequences reached the terminal; one user's flood of entries was read
whole by everyone else's `status`.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.host import registry
from minilmd.fsio import atomic_write_json
from second_user import second_user, shared_dir, user_python

pytestmark = pytest.mark.root

THIRD_UID = 54321
"""A third user for the shadow attack: a uid without an account owns files all the same."""
BRACKETS = "[" * 60_000


class Place:
    """A shared registry (what an admin makes of /var/lib/minilmd/runs) and each user's environment."""

    def __init__(self, root: Path, uid: int, gid: int):
        self.root, self.uid, self.gid = root, uid, gid
        self.system = root / "system"
        self.system.mkdir()
        self.system.chmod(0o1777)
        self.root_env = {"XDG_STATE_HOME": str(root / "root-state"), names.SYSTEM_REGISTRY_ENV: str(self.system)}
        self.nobody_env = {"XDG_STATE_HOME": str(root / "nobody-state"),
                           names.SYSTEM_REGISTRY_ENV: str(self.system)}

    def run_dir(self, name: str, owner: str = "root", state: dict | None = None) -> Path:
        run_dir = self.root / name
        run_dir.mkdir()
        body = new_state(name, run_dir, "x.toml")
        body.update(state or {"phase": "training"})
        atomic_write_json(run_dir / names.STATE, body)
        (run_dir / names.STATE).chmod(0o644)
        if owner == "nobody":
            for path in (run_dir, run_dir / names.STATE):
                os.chown(path, self.uid, self.gid)
        return run_dir

    def as_nobody(self, code: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(user_python(code, *args), capture_output=True, text=True, cwd="/", timeout=60,
                              env={**os.environ, **self.nobody_env})
        assert not check or done.returncode == 0, done.stderr
        return done

    def nobody_registers(self, name: str, run_dir: Path, *more: str) -> str:
        """nobody's supervisors registering their runs (more: further name, run dir pairs); events on stdout."""
        return self.as_nobody("import sys\nfrom minilmd.daemon.host import registry\n"
                              "for name, run_dir in zip(sys.argv[1::2], sys.argv[2::2]):\n"
                              "    registry.register_quietly(name, run_dir, 'x.toml', "
                              "lambda kind, message: print(kind, message))\n", name, str(run_dir), *more).stdout

    def nobody_writes(self, path: Path, text: str) -> None:
        self.as_nobody("import sys\nopen(sys.argv[1], 'w').write(sys.argv[2])\n", str(path), text)

    def root_cli(self, *args: str) -> subprocess.CompletedProcess:
        """root's `minilmd ...` in a process of its own: a hang is a timeout, a crash an exit status."""
        return subprocess.run([sys.executable, "-m", "minilmd.cli", *args], capture_output=True, text=True,
                              timeout=60, env={**os.environ, **self.root_env})


@pytest.fixture
def place(monkeypatch):
    uid, gid = second_user()
    root = shared_dir()
    try:
        here = Place(root, uid, gid)
        for key, value in here.root_env.items():
            monkeypatch.setenv(key, value)
        yield here
    finally:
        shutil.rmtree(root, ignore_errors=True)


def key(run_dir: Path) -> str:
    return registry.entry_name("x", run_dir)[len("x-"):-len(".json")]


@pytest.mark.slow
def test_one_bad_entry_blinds_nobody(place):
    place.nobody_registers("n-run", place.run_dir("n-run", "nobody"))
    registry.register("r-run", place.run_dir("r-run"), "x.toml")
    place.nobody_writes(place.system / f"{place.uid}-junk-{'0' * 12}.json", BRACKETS)
    place.nobody_writes(place.system / "0-bomb.json", BRACKETS)  # under root's uid: still nobody's file
    place.nobody_writes(place.system / f"{place.uid}-list.json", "[1, 2]")
    place.as_nobody("import os, sys\nos.mkfifo(sys.argv[1])\n", str(place.system / f"{place.uid}-fifo.json"))

    done = place.root_cli("status", "--all")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    runs = [line.split()[0] for line in done.stdout.splitlines()[1:] if line.split()[0] in ("n-run", "r-run")]
    assert runs == ["n-run", "r-run"], done.stdout
    assert f"4 entries of user nobody (uid {place.uid}) unreadable" in done.stdout, done.stdout
    assert "(nested deeper than 4)" in done.stdout and "(a FIFO)" in done.stdout, done.stdout

    theirs = place.as_nobody("from minilmd.daemon.views import overview\noverview.status_all()\n").stdout
    assert "n-run" in theirs and "r-run" not in theirs and "(nested deeper than 4)" in theirs, theirs
    listed = place.root_cli("status", "--all", "--json")
    assert listed.returncode == 0 and {r["run"] for r in json.loads(listed.stdout)} == {"n-run", "r-run"}
    assert "unreadable" in listed.stderr  # the notes go to stderr: stdout stays one JSON list
    assert place.root_cli("forget", str(place.root / "r-run")).returncode == 0  # by path: its run dir exists


def test_a_state_json_that_hangs_or_lies_is_unreadable_in_the_overview(place):
    runs = {"n-fifo": "a FIFO", "n-zero": "a symbolic link", "n-list": "a list, not an object"}
    pairs = []
    for name in (*runs, "n-lies"):
        run_dir = place.run_dir(name, "nobody")
        (run_dir / names.STATE).unlink()
        pairs += [name, str(run_dir)]
    place.nobody_registers(*pairs)
    code = ("import json, os, sys\nd = sys.argv[1]\nos.mkfifo(d + '/n-fifo/state.json')\n"
            "os.symlink('/dev/zero', d + '/n-zero/state.json')\n"
            "open(d + '/n-list/state.json', 'w').write('[1]')\n"
            "open(d + '/n-lies/state.json', 'w').write(json.dumps({'phase': 3, 'progress': {'step': 'many', "
            "'total_steps': [], 'loss': 'low', 'tok_s': {}}, 'supervisor': [], 'devices': 'all', 'restarts': 7, "
            "'sync': {'state': 'ok', 'last_ok': 'never'}}))\n")
    place.as_nobody(code, str(place.root))
    done = place.root_cli("status", "--all")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()[1:] if line.startswith("n-")}
    for name, why in runs.items():
        assert f"unreadable ({why})" in lines[name], done.stdout
    # shown; a phase that is no string reads as none, its nonsense numbers as "-"
    assert lines["n-lies"].split()[1:3] == ["(not", "running)"], done.stdout
    rows = {r["run"]: r for r in json.loads(place.root_cli("status", "--all", "--json").stdout)}
    assert rows["n-lies"]["step"] is None and rows["n-lies"]["loss"] is None and rows["n-lies"]["restarts"] == 0
    assert rows["n-fifo"]["phase"] == "unreadable" and rows["n-fifo"]["why"] == "a FIFO"


def test_a_squatted_entry_name_makes_the_run_register_under_a_fresh_one(place):
    mine = place.run_dir("r-sq")
    squatted = place.system / registry.entry_name("r-sq", mine, 0)
    decoy = {"name": "r-sq", "run_dir": str(place.root / "decoy"), "config": "", "uid": 0, "registered": 1.0}
    place.nobody_writes(squatted, json.dumps(decoy))
    events = []
    for _ in range(2):  # a restart registers again, under the same fresh name
        registry.register_quietly("r-sq", mine, "x.toml", lambda kind, message: events.append((kind, message)))
    assert json.loads(squatted.read_text()) == decoy and squatted.stat().st_uid == place.uid  # never replaced
    ours = [p for p in place.system.iterdir() if p.name.startswith("0-r-sq-") and p != squatted]
    assert len(ours) == 1 and ours[0].stat().st_uid == 0 and json.loads(ours[0].read_text())["run_dir"] == str(mine)
    assert events and all(kind == "registry" for kind, _ in events)
    assert "user nobody" in events[0][1] and ours[0].name in events[0][1], events

    theirs = place.run_dir("n-sq", "nobody")
    (place.system / registry.entry_name("n-sq", theirs, place.uid)).write_text("{}")  # root squats nobody's name
    said = place.nobody_registers("n-sq", theirs)
    assert said.startswith("registry ") and "user root" in said, said
    rows = {r["run"]: r for r in json.loads(place.root_cli("status", "--all", "--json").stdout)}
    assert rows["n-sq"]["uid"] == place.uid and rows["n-sq"]["run_dir"] == str(theirs)
    assert rows["r-sq"]["run_dir"] == str(mine)


def test_a_shadow_entry_cannot_make_root_see_her_run_as_his(place):
    hers = place.run_dir("n-run", "nobody")
    place.nobody_registers("n-run", hers)
    shadow = place.system / registry.entry_name("n-run", hers, THIRD_UID)  # sorts before hers
    shadow.write_text(json.dumps({"name": "n-run", "run_dir": str(hers), "config": "", "uid": THIRD_UID,
                                  "registered": time.time()}))
    os.chown(shadow, THIRD_UID, THIRD_UID)
    rows = [r for r in json.loads(place.root_cli("status", "--all", "--json").stdout) if r["run"] == "n-run"]
    assert [r["uid"] for r in rows] == [place.uid], rows
    assert "names a run directory of user nobody" in place.root_cli("status", "--all").stdout


def test_forget_never_builds_a_path_outside_the_registry(place):
    gone = place.root / "gone"
    precious = place.root / f"precious-{key(gone)}.json"  # where user_dir() / "../../../precious-<key>.json" lands
    precious.write_text("root's\n")
    forged = {"name": "../../../precious", "run_dir": str(gone), "config": "", "uid": place.uid, "registered": 1.0}
    place.nobody_writes(place.system / f"{place.uid}-forged.json", json.dumps(forged))
    registry.register("r-run", place.run_dir("r-run"), "x.toml")
    assert registry.forget("../../../precious").removed == []
    assert precious.read_text() == "root's\n"
    by_path = str((place.root / "r-run").resolve())  # the real path the view reaches (runarg.real_path)
    removed = registry.forget(str(place.root / "r-run"), by_path).removed  # by path: by name, one still there is kept
    assert [p.parent for p in removed] == [registry.user_dir(), place.system]


def test_control_characters_in_names_and_paths_never_reach_the_terminal(place):
    odd = place.run_dir("n-odd\x1b]0;owned\x07\nline", "nobody")
    place.nobody_registers("n-odd", odd)
    evil = "evil\x1b[2J"
    gone = place.root / "gone"
    place.nobody_writes(place.system / f"{place.uid}-{evil}-{key(gone)}.json",
                        json.dumps({"name": evil, "run_dir": str(gone), "uid": place.uid}))
    done = place.root_cli("status", "--all")
    shown = done.stdout + done.stderr
    assert done.returncode == 0 and "n-odd" in shown, shown
    assert not any(ch in shown for ch in "\x1b\x07"), repr(shown)
    assert "n-odd\\x1b]0;owned\\x07\\nline" in shown and "evil\\x1b[2J" in shown, shown


def test_one_user_flooding_the_registry_is_capped(place, monkeypatch):
    monkeypatch.setattr(registry, "MAX_ENTRIES_PER_USER", 5)
    place.as_nobody("import sys\nfrom minilmd.daemon.host import registry\n"
                    "for i in range(12): registry.register(f'flood-{i:02d}', sys.argv[1] + f'/f{i}', 'x.toml')\n",
                    str(place.root))
    registry.register("r-run", place.run_dir("r-run"), "x.toml")
    scan = registry.scan()
    assert sorted(e.name for e in scan.entries if e.uid == place.uid) == [f"flood-{i:02d}" for i in range(5)]
    assert "r-run" in [e.name for e in scan.entries]
    flood = f"user nobody (uid {place.uid}) has 12 entries"
    assert any(flood in note and "first 5" in note for note in scan.notes), scan.notes
