"""Reading a local remote's file (daemon/jobs/remote_local.py: LocalRemote.cat, .open) when another user swaps a
directory on its way for a link.

Before, `_untrusted` looked at each directory on the way with lstat, then opened the file by its whole path: a
step directory renamed away and replaced by a link to another directory between that look and the open was
followed, and that other directory's file read as the run's. Now each directory is opened without following a link
(remote_write.parent_dir) and the file opened by its name in the last one (untrusted.open_regular's dir_fd). The
swap below is real: the directory renamed and a link made in its place, at the moment the reader looks at the file
itself (its lstat), which is after every look at the directories on the way and before the open.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minilmd.daemon.jobs.remote_local import open_remote
from minilmd.names import MANIFEST, MANIFEST_MAX_BYTES
from minilmd.untrusted import Unreadable

OURS, THEIRS = b'{"ours": true}', b'{"theirs": true}'


@pytest.fixture
def remote_with_theirs(tmp_path) -> tuple[Path, Path]:
    """(a remote holding step-00000010/manifest.json, another user's directory holding another manifest.json)."""
    remote, theirs = tmp_path / "remote", tmp_path / "theirs"
    (remote / "step-00000010").mkdir(parents=True)
    (remote / "step-00000010" / MANIFEST).write_bytes(OURS)
    theirs.mkdir()
    (theirs / MANIFEST).write_bytes(THEIRS)
    return remote, theirs


def swap_when_the_file_is_looked_at(monkeypatch, remote: Path, theirs: Path) -> list[bool]:
    """At the first lstat of a manifest.json: the step directory renamed away and a link to `theirs` put in its
    place (another user's race, made certain). The list says whether it happened."""
    real, swapped = os.lstat, []

    def lstat(path, *args, **kwargs):
        if not swapped and os.fspath(path).rsplit("/", 1)[-1] == MANIFEST:
            swapped.append(True)
            os.rename(remote / "step-00000010", remote / "moved-away")
            os.symlink(theirs, remote / "step-00000010")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    return swapped


READS = {
    "cat": lambda r: r.cat(r.path("step-00000010", MANIFEST), MANIFEST_MAX_BYTES),
    "open": lambda r: r.open("step-00000010", MANIFEST).read(),
}


@pytest.mark.parametrize("read", READS, ids=list(READS))
def test_a_directory_swapped_for_a_link_after_its_look_is_not_followed(remote_with_theirs, monkeypatch, read):
    remote, theirs = remote_with_theirs
    swapped = swap_when_the_file_is_looked_at(monkeypatch, remote, theirs)
    got = READS[read](open_remote(str(remote)))
    assert swapped and (remote / "step-00000010").is_symlink()  # the swap took place before the open
    assert got == OURS  # the file of the directory the walk opened, never the one the link points at


def test_a_link_on_the_way_is_refused_saying_what_it_is(remote_with_theirs):
    remote, theirs = remote_with_theirs
    (remote / "step-00000020").symlink_to(theirs)
    r = open_remote(str(remote))
    for read in (lambda: r.cat(r.path("step-00000020", MANIFEST), MANIFEST_MAX_BYTES),
                 lambda: r.open("step-00000020", MANIFEST)):
        with pytest.raises(Unreadable) as refused:
            read()
        assert refused.value.kind == "link"
        assert refused.value.why == f"{remote}/step-00000020 is a symbolic link to {theirs}: not followed"
        assert str(refused.value).startswith(f"{remote}/step-00000020/{MANIFEST}: ")
    assert r.manifest_or_problems("step-00000020") == \
        (None, [f"cannot read {MANIFEST}: {remote}/step-00000020 is a symbolic link to {theirs}: not followed"])


def test_what_is_missing_on_the_way_or_at_the_end_is_file_not_found(remote_with_theirs):
    remote, _ = remote_with_theirs
    r = open_remote(str(remote))
    for names in (("step-00000099", MANIFEST), ("step-00000010", "absent.json")):
        with pytest.raises(FileNotFoundError):
            r.cat(r.path(*names), MANIFEST_MAX_BYTES)
        with pytest.raises(FileNotFoundError):
            r.open(*names)
    assert r.read_text("step-00000099", MANIFEST) is None


def test_the_file_itself_is_refused_by_its_kind_and_named_by_its_whole_path(remote_with_theirs):
    remote, theirs = remote_with_theirs
    (remote / "step-00000010" / "linked").symlink_to(theirs / MANIFEST)
    os.mkfifo(remote / "step-00000010" / "fifo")
    r = open_remote(str(remote))
    for name, kind, why in (("linked", "link", "a symbolic link"), ("fifo", "not_regular", "a FIFO")):
        with pytest.raises(Unreadable) as refused:
            r.cat(r.path("step-00000010", name), MANIFEST_MAX_BYTES)
        assert (refused.value.kind, str(refused.value)) == (kind, f"{remote}/step-00000010/{name}: {why}")
    with pytest.raises(Unreadable, match="over 4 bytes") as big:
        r.cat(r.path("step-00000010", MANIFEST), 4)
    assert big.value.kind == "too_big"
