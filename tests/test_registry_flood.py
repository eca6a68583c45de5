"""A flood of another user's files in the shared registry costs the others a directory listing, not a look at each
file (hostile audit 4: 300,000 empty files of mal's took root's `status --all` from 1.3 s to 8.5 s, lstat'ing every
one before the per-user cap). The cap counts names by the uid they claim before any file is looked at, and root's
listing looks at MAX_NAMES_EXAMINED names at most, saying what it cut. The count of lstat calls is the bound shown."""
from __future__ import annotations

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


def test_roots_listing_looks_at_a_bounded_number_of_names_and_says_so(system, monkeypatch):
    folder, uid = system
    monkeypatch.setattr(registry, "MAX_NAMES_EXAMINED", 50, raising=False)
    flood(folder, [f"{60000 + i}-x.json" for i in range(300)], uid)  # each name claims another uid
    seen = lstats_in(folder, monkeypatch)
    scan = registry.scan()
    assert len(seen) <= 50, len(seen)
    assert any("300 entries, more than a listing looks at: only the first 50" in note for note in scan.notes), \
        scan.notes
