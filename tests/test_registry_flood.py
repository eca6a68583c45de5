"""A flood of a user's own files in the shared registry costs the others a directory listing, not a look at each
file (hostile audit 4: 300,000 empty files of mal's took root's `status --all` from 1.3 s to 8.5 s, lstat'ing every
one before the per-user cap): once a uid's own files fill the cap, the names claiming it are passed over unlooked
at. Nothing is cut by a name's claim alone (a review found a cut by claim, and one of all names after the first
20,000, hid a victim's runs from him and from root behind names anyone can make). The count of lstat calls is the
bound shown."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from minilmd import names
from minilmd.daemon.host import registry
from second_user import second_user, shared_dir

pytestmark = pytest.mark.root


@pytest.fixture
def system(monkeypatch):
    uid, _ = second_user()
    root = shared_dir()
    try:
        folder = root / "system"
        folder.mkdir()
        folder.chmod(0o1777)
        monkeypatch.setenv("XDG_STATE_HOME", str(root / "root-state"))
        monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(folder))
        yield folder, uid
    finally:
        shutil.rmtree(root, ignore_errors=True)


def flood(folder, names_: list[str], uid: int) -> None:
    """Empty files of another user's (root gives them their owner, as the user's own creat would)."""
    for name in names_:
        fd = os.open(folder / name, os.O_CREAT | os.O_WRONLY, 0o644)
        os.fchown(fd, uid, uid)
        os.close(fd)


def lstats_in(folder, monkeypatch) -> set[str]:
    """The files in folder that os.lstat is asked about from now on (each once: a read looks again)."""
    seen: set[str] = set()
    real = os.lstat

    def counting(path, *args, **kwargs):
        if str(path).startswith(f"{folder}/"):
            seen.add(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", counting)
    return seen


def test_one_uids_flood_is_cut_by_name_before_any_file_is_looked_at(system, monkeypatch):
    folder, uid = system
    monkeypatch.setattr(registry, "MAX_ENTRIES_PER_USER", 20)
    flood(folder, [f"{uid}-x{i:05d}.json" for i in range(600)], uid)
    seen = lstats_in(folder, monkeypatch)
    scan = registry.scan()
    assert len(seen) <= 20, len(seen)  # 600 before: every file looked at, then cut
    assert any("has 600 entries" in note and "first 20" in note for note in scan.notes), scan.notes


def entry_of(folder, name: str, run_dir, uid: int):
    """A real entry of `uid`'s in the system registry, as register writes it (its file his)."""
    path = folder / registry.entry_name(name, run_dir, uid)
    path.write_text(json.dumps({"name": name, "run_dir": str(run_dir), "uid": uid, "config": "", "registered": 1.0}))
    os.chown(path, uid, uid)
    return path


@pytest.mark.parametrize("as_root", [True, False])
def test_names_claiming_a_user_or_many_uids_hide_none_of_his_runs(system, monkeypatch, tmp_path, as_root):
    folder, uid = system
    monkeypatch.setattr(registry, "MAX_ENTRIES_PER_USER", 20)
    run_dir = tmp_path / "zeta-run"
    run_dir.mkdir()
    os.chown(run_dir, uid, uid)
    entry_of(folder, "zeta", run_dir, uid)
    flood(folder, [f"{uid}-a{i:05d}.json" for i in range(100)], 0)  # names claiming him, files of another's
    flood(folder, [f"{60000 + i}-x.json" for i in range(300)], 0)  # each name claims another uid
    scan = registry.scan(reader_uid=0 if as_root else uid)
    assert [(e.name, e.uid) for e in scan.entries] == [("zeta", uid)], scan.notes
