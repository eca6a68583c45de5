"""minilmd/mount_places.py reads where this machine mounts shares, once per check, from fake tables under a root
directory (`read_config(root, owner)`) or a faked `snapshot`: systemd mount units, autofs's auto.master.d and the
files its master maps include; and a remote below an empty directory no table names is said to be made there, not
"its share gone?" (daemon/jobs/remotewait.py made_by_first_sync)."""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from minilmd import mount_places
from minilmd.config import load_config
from minilmd.daemon.jobs import remotewait
from minilmd.mount_places import MountConfig, read_config
from minilmd.path_checks import remote_parents_refused
from supervisor_helpers import write_config

UNNAMED = "an empty directory that no fstab, autofs map or systemd unit names as a mount point"


def tables(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def faked(monkeypatch, config: MountConfig) -> None:
    monkeypatch.setattr(mount_places, "snapshot", lambda: config)
    monkeypatch.setenv("HOME", "/nonexistent-home")  # tmp_path is no home directory here


def test_a_share_a_systemd_unit_mounts_is_known(tmp_path, monkeypatch):
    """Before: a share mounted by a .mount unit (not in fstab) was unknown: a typo beside it, or a remote below its
    unmounted stub, made the chain on the local disk."""
    srv = tmp_path / "srv"
    (srv / "data").mkdir(parents=True)
    root = tables(tmp_path / "root", {
        "etc/systemd/system/srv-data.mount": f"[Unit]\nDescription=nas\n[Mount]\nWhat=nas:/data\nWhere={srv}/data\n",
        "run/systemd/system/srv-auto.automount": f"[Automount]\nWhere={srv}/auto\n",
        "etc/systemd/system/in-unit.mount": f"[Unit]\nWhere={tmp_path}/unit-section\n",  # no [Mount] section
        "etc/systemd/system/x.service": f"[Mount]\nWhere={tmp_path}/service\n",  # no mount unit
        "etc/systemd/system/big.mount": f"[Mount]\nWhere={tmp_path}/big\n" + "#" * mount_places.MAX_UNIT_BYTES,
        "vendor/linked.mount": f"[Mount]\nWhere={tmp_path}/linked\n",
    })
    (root / "etc/systemd/system/linked.mount").symlink_to(root / "vendor/linked.mount")  # a link: not followed
    os.mkfifo(root / "etc/systemd/system/fifo.mount")  # not a regular file: skipped, never opened (no block)
    config = read_config(str(root), owner=os.geteuid())
    assert config.points == {f"{srv}/data", f"{srv}/auto"}, config
    faked(monkeypatch, config)
    said = remote_parents_refused(str(srv / "data" / "me" / "w0"))
    assert f"({srv}/data is an empty directory, not a mount point)" in said, said
    said = remote_parents_refused(str(srv / "dta" / "w0"))  # a typo beside the share
    assert f"{srv} holds no dta, and nothing is made in {srv}, where shares are mounted" in said, said


def test_an_fstab_mount_point_with_a_space_is_read_as_its_path(tmp_path, monkeypatch):
    """fstab writes a space in a mount point as \\040 (a tab as \\011), as mountinfo does. Before: the point was
    kept as written, `/srv/lab\\040data`, so an unmounted share there was taken for an empty directory the user made."""
    share = tmp_path / "lab data"
    share.mkdir()
    written = str(share).replace(" ", "\\040")
    root = tables(tmp_path / "root", {"etc/fstab": f"# a comment\nnas:/lab {written} nfs defaults 0 0\n"
                                                   f"nas:/tab {tmp_path}/a\\011b nfs defaults 0 0\n"})
    config = read_config(str(root), owner=os.geteuid())
    assert config.points == {str(share), f"{tmp_path}/a\tb"}, config
    faked(monkeypatch, config)
    said = remote_parents_refused(str(share / "me" / "w0"))
    assert f"({share} is an empty directory, not a mount point)" in said, said


def test_systemd_unit_directories_are_read_bounded(tmp_path, monkeypatch):
    root = tables(tmp_path / "root", {f"etc/systemd/system/u{i}.mount": f"[Mount]\nWhere=/u{i}\n" for i in range(3)})
    monkeypatch.setattr(mount_places, "MAX_FILES", 2)
    assert read_config(str(root), owner=os.geteuid()).points == {"/u0", "/u1"}
    monkeypatch.setattr(mount_places, "MAX_DIR_ENTRIES", 2)  # a directory of too many entries: none read
    assert read_config(str(root), owner=os.geteuid()).points == frozenset()


def test_autofs_maps_in_auto_master_d_and_included_files_are_read(tmp_path, monkeypatch):
    """Before: only /etc/auto.master's own lines were read, not /etc/auto.master.d nor its `+` includes."""
    root = tables(tmp_path / "root", {
        "etc/auto.master": "+auto.master\n+dir:/etc/more.d\n+file:/etc/auto.master.extra\n/misc2 /etc/auto.misc2\n",
        "etc/auto.master.d/direct.autofs": "/- /etc/auto.direct --timeout=60\n",
        "etc/auto.master.d/notes.txt": f"{tmp_path}/not-a-map /etc/auto.x\n",  # no .autofs: autofs skips it too
        "etc/auto.direct": f"{tmp_path}/direct/proj -fstype=nfs nas:/proj\n",
        "etc/more.d/homes.autofs": f"{tmp_path}/homes /etc/auto.homes\n+dir:/etc/more.d\n",  # itself: read once
        "etc/auto.master.extra": f"{tmp_path}/extra file:/etc/auto.extra\n/- nis:auto.direct\n",
    })
    config = read_config(str(root), owner=os.geteuid())
    assert config.points == {f"{tmp_path}/direct/proj"}, config
    assert config.autofs_dirs == {"/misc2", f"{tmp_path}/homes", f"{tmp_path}/extra"}, config
    (tmp_path / "homes").mkdir()  # autofs not running: its directory is there, empty
    faked(monkeypatch, config)
    said = remote_parents_refused(str(tmp_path / "homes" / "alice" / "w0"))
    assert f"{tmp_path}/homes holds no alice, and nothing is made in {tmp_path}/homes" in said, said


def test_each_check_reads_the_mount_tables_once(tmp_path, monkeypatch):
    """Before: /etc/fstab was read twice and /etc/auto.master four times by one remote_parents_refused."""
    reads: Counter[str] = Counter()
    real = mount_places.read_bytes

    def counted(path, **kw):
        reads[os.fspath(path)] += 1
        return real(path, **kw)

    monkeypatch.setattr(mount_places, "read_bytes", counted)
    monkeypatch.setenv("HOME", "/nonexistent-home")
    empty = tmp_path / "empty"
    empty.mkdir()  # the check goes on to ask whether it is a share's stub
    remote_parents_refused(str(empty / "a" / "w0"))
    assert reads[mount_places.FSTAB] == 1 and reads[mount_places.AUTO_MASTER] == 1, reads
    reads.clear()
    remotewait.made_by_first_sync(str(empty / "a" / "w0"))  # the refusal and the words, from one reading
    assert reads[mount_places.FSTAB] == 1 and reads[mount_places.AUTO_MASTER] == 1, reads


def test_a_remote_below_an_empty_directory_the_user_made_is_said_to_be_made_there(tmp_path, monkeypatch, corpus):
    """Before: `--check` said `is not there (its share gone?)` of a new run's remote below an empty directory the
    user made, though the first sync makes the chain there; one a mount table names is still its share's stub."""
    mine = tmp_path / "mine"
    mine.mkdir()
    faked(monkeypatch, MountConfig())
    remote = mine / "runs" / "s"
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote)})
    assert remotewait.check_line(load_config(config), fresh=False) == (
        f"starts from step 0: run.remote: {remote} does not exist yet (the first sync creates it and the directories "
        f"missing above it in {mine}, {UNNAMED}), and this run has never synced to it; scratch holds no checkpoint")
    assert remotewait.made_by_first_sync(str(mine / "s")) == \
        f"does not exist yet (the first sync creates it in {mine}, {UNNAMED})"
    (mine / "s").mkdir()
    assert remotewait.made_by_first_sync(str(mine / "s")) == f"is {UNNAMED} (the first sync writes in it)"
    (mine / "s").rmdir()
    faked(monkeypatch, MountConfig(frozenset({str(mine)})))  # fstab names it: an unmounted share's stub
    assert remotewait.made_by_first_sync(str(mine / "s")) == ""
    assert remotewait.check_line(load_config(config), fresh=False) == (
        f"starts from step 0: run.remote: {remote} is not there (its share gone?), and this run has never synced to "
        f"it; scratch holds no checkpoint")


@pytest.mark.parametrize("spec, path", [("/etc/auto.d", "/etc/auto.d"), ("file:/etc/auto.d", "/etc/auto.d"),
                                        ("file,sun:/etc/auto.d", "/etc/auto.d"), ("auto.d", ""),
                                        ("nis:auto.d", ""), ("ldap:ldap://h/ou=auto", ""), ("program:/bin/m", "")])
def test_only_file_maps_are_read(spec, path):
    assert mount_places._map_file(spec) == path
